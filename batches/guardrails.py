"""Guardrails: a batch's spend cap and error breaker, its organization's monthly budget, and
pausing and resuming a batch by hand.

The engine enforces them (batches.engine.spend and batches.engine.breaker: a call's worst case is
reserved against what is left before it is sent, failures are judged as
they are flushed); this module holds what the API and the engine share: how
much an organization has spent this month, the create-time checks, and the
owner's pause and resume. A paused batch is a running batch that claims
nothing (batches.lifecycle.pause).
"""

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from batches import lifecycle
from batches.models import Batch, BatchStatus, PauseReason
from billing.models import LedgerEntry
from billing.pricing import NANOS_PER_USD, spend_nanos, usd
from openrelay.api.errors import ApiError, Conflict

# What a batch's spend needs of its row: its live counters, billed and unbilled, and snapshotted prices.
COST_FIELDS = ("input_tokens", "cached_tokens", "output_tokens", "price_input", "price_cached_input", "price_output")
COST_FIELDS += ("price_multiplier", "unbilled_input_tokens", "unbilled_cached_tokens", "unbilled_output_tokens")


@dataclass(frozen=True)
class Breaker:
    """The error breaker's rules (0 turns one off): pause when `failures` of the first `window`
    finished records failed with one record-level code, or `consecutive` in a row did."""

    window: int
    failures: int
    consecutive: int

    @classmethod
    def default(cls):
        return cls(
            settings.OPENRELAY_BREAKER_WINDOW,
            settings.OPENRELAY_BREAKER_FAILURES,
            settings.OPENRELAY_BREAKER_CONSECUTIVE,
        )

    @classmethod
    def off(cls):
        return cls(0, 0, 0)

    def as_fields(self):
        return {
            "breaker_window": self.window,
            "breaker_failures": self.failures,
            "breaker_consecutive": self.consecutive,
        }


class BudgetExceeded(ApiError):
    """The organization's monthly budget is spent: 402, final (the SDKs must not retry it)."""

    status = 402

    def __init__(self, organization, spent_nanos):
        super().__init__(
            f"Organization '{organization.name}' has spent {usd(spent_nanos)} USD of its monthly budget of "
            f"{organization.monthly_budget} USD this month; no batch can be created or resumed until an "
            "administrator raises the budget or the month ends.",
            code="organization_budget_exceeded",
            type="invalid_request_error",
            headers={"x-should-retry": "false"},
        )


def usd_to_nanos(amount):
    return int(Decimal(amount) * NANOS_PER_USD)


def month_start(now):
    return datetime(now.year, now.month, 1, tzinfo=UTC)


def organization_spend_nanos(organization_id, now=None):
    """What the organization's batches spent this calendar month (UTC): the ledger's entries
    billed this month plus the live spend of its batches still running (billed when they end).

    Unbilled usage counts too (billing.pricing.unbilled_cost: answers a record got but is not
    billed for, at the batch's prices): no tenant consumes inference past its budget unbilled."""
    now = now or timezone.now()
    billed = LedgerEntry.objects.filter(organization_id=organization_id, created_at__gte=month_start(now))
    sums = billed.aggregate(billed=Sum("total_cost_nanos"), unbilled=Sum("unbilled_cost_nanos"))
    total = int(sums["billed"] or 0) + int(sums["unbilled"] or 0)
    running = Batch.objects.filter(organization_id=organization_id, billed_at__isnull=True).exclude(
        status=BatchStatus.FAILED
    )
    for batch in running.only(*COST_FIELDS):
        total += spend_nanos(batch)
    return total


def budget_nanos(organization):
    return usd_to_nanos(organization.monthly_budget) if organization.monthly_budget is not None else None


def budget_object(organization, now=None):
    """The organization's budget and this month's spend, as /v1/limits shows it (null: no budget)."""
    if organization.monthly_budget is None:
        return None
    spent = organization_spend_nanos(organization.pk, now)
    budget = budget_nanos(organization)
    return {
        "currency": "USD",
        "period": "month",
        "budget": usd(budget),
        "spent": usd(spent),
        "remaining": usd(max(0, budget - spent)),
        "exhausted": spent >= budget,
    }


def check_budget(organization):
    """Raise BudgetExceeded when the organization has spent its monthly budget."""
    budget = budget_nanos(organization)
    if budget is None:
        return
    spent = organization_spend_nanos(organization.pk)
    if spent >= budget:
        raise BudgetExceeded(organization, spent)


# ---------------------------------------------------------------------------
# The owner's pause and resume


def pause_batch(batch):
    """Pause a running batch by hand; return it as it now stands (already paused: unchanged)."""
    if batch.status not in lifecycle.PAUSABLE:
        raise Conflict(f"Cannot pause a batch with status '{batch.status}'.", code="batch_not_pausable")
    if not lifecycle.pause(batch, PauseReason.REQUESTED, detail={"message": "Paused by its owner."}):
        batch.refresh_from_db()
        if batch.status not in lifecycle.PAUSABLE:
            raise Conflict(f"Cannot pause a batch with status '{batch.status}'.", code="batch_not_pausable")
    return batch


def resume_batch(batch, *, max_cost_nanos=None):
    """Resume a paused batch, optionally with a new spend cap; return it as it now stands.

    Not paused: unchanged (a new cap is still written). 409 when it is no longer
    running or its cap (old or new) is already spent; 402 when its organization's
    budget is.
    """
    if batch.status not in lifecycle.PAUSABLE:
        raise Conflict(f"Cannot resume a batch with status '{batch.status}'.", code="batch_not_resumable")
    fields = {} if max_cost_nanos is None else {"max_cost_nanos": max_cost_nanos}
    cap = batch.max_cost_nanos if max_cost_nanos is None else max_cost_nanos
    spent = spend_nanos(batch)
    if cap is not None and spent >= cap:
        raise Conflict(
            f"Batch {batch.public_id} has spent {usd(spent)} USD of its max_cost of {usd(cap)} USD; "
            "resume it with a higher max_cost.",
            param="max_cost",
            code="spend_cap_reached",
        )
    check_budget(batch.organization)
    if batch.pause_reason == PauseReason.ERROR_BREAKER and batch.paused_at is not None:
        # The first-records rule has had its look: resumed, it would trip again on the same records.
        fields["breaker_window"] = 0
    with transaction.atomic():
        if batch.paused_at is None or not lifecycle.resume(batch, **fields):
            if fields:
                Batch.objects.filter(pk=batch.pk).update(**fields)
            batch.refresh_from_db()
    return batch
