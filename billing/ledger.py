"""The ledger: one entry per batch, written at its terminal transition, exactly once.

The engine calls `bill_batch` inside the transaction that makes a batch
completed, expired or cancelled, so the entry commits with that status or
not at all: a crash before the commit leaves neither (the sweeper closes the
batch again and bills it then), and a closer that loses the race to close a
batch never gets here. The unique batch_id is the last guard: a second call
for one batch, even concurrent, returns the first entry and writes nothing.

Billing reads a batch (its counters, prices, status) but never imports or
drives one; `batch` is whatever the caller hands in with those attributes.
"""

from datetime import UTC, datetime, time

from django.db import transaction
from django.db.models import Count, Sum
from django.db.models.functions import TruncDate, TruncMonth

from billing.models import LedgerEntry
from billing.pricing import Cost, batch_cost, unbilled_cost

# What the entry is made of, read again from the database when billing.
BATCH_FIELDS = (
    "status",
    "input_tokens",
    "cached_tokens",
    "output_tokens",
    "reasoning_tokens",
    "unbilled_input_tokens",
    "unbilled_cached_tokens",
    "unbilled_output_tokens",
    "price_input",
    "price_cached_input",
    "price_output",
    "price_multiplier",
)
TOKEN_SUMS = ("input_tokens", "cached_tokens", "output_tokens")
COST_SUMS = ("input_cost_nanos", "cached_input_cost_nanos", "output_cost_nanos")
UNBILLED_SUMS = ("unbilled_input_tokens", "unbilled_cached_tokens", "unbilled_output_tokens", "unbilled_cost_nanos")


class NotBillable(Exception):
    """The batch has not reached its terminal transition."""


def bill_batch(batch):
    """Write the batch's ledger entry and return it; return the existing one if it was billed.

    Bills the batch's rolled-up usage: every record's billed usage, summed as
    records finished (see batches/engine/outcomes.py for what each kind bills).
    Its unbilled usage is kept beside, with what it came to at the same prices
    (unbilled_cost_nanos): never charged, counted against the monthly budget.
    """
    with transaction.atomic():
        # The caller's instance may predate the last flush's roll-up; the
        # terminal transition (already made in this transaction) stopped
        # further flushes, so the counters read now are final.
        batch.refresh_from_db(fields=BATCH_FIELDS)
        if not batch.is_terminal:
            # An entry now would freeze a partial bill: the unique batch_id
            # would then refuse the real one.
            raise NotBillable(f"Batch {batch.public_id} is {batch.status}; it is billed when it ends.")
        # get_or_create inserts in a savepoint: a racing second caller blocks
        # on the unique index, then reads the winner's row instead.
        entry, _ = LedgerEntry.objects.get_or_create(batch_id=batch.public_id, defaults=_entry_fields(batch))
    return entry


def _entry_fields(batch):
    cost = batch_cost(batch)
    return {
        "organization_id": batch.organization_id,
        "batch_status": batch.status,
        "model_name": batch.model_name,
        "priority": batch.priority,
        "input_tokens": batch.input_tokens,
        "cached_tokens": batch.cached_tokens,
        "output_tokens": batch.output_tokens,
        "reasoning_tokens": batch.reasoning_tokens,
        "price_input": batch.price_input,
        "price_cached_input": batch.price_cached_input,
        "price_output": batch.price_output,
        "price_multiplier": batch.price_multiplier,
        "input_cost_nanos": cost.input_nanos,
        "cached_input_cost_nanos": cost.cached_input_nanos,
        "output_cost_nanos": cost.output_nanos,
        "total_cost_nanos": cost.total_nanos,
        "unbilled_input_tokens": batch.unbilled_input_tokens,
        "unbilled_cached_tokens": batch.unbilled_cached_tokens,
        "unbilled_output_tokens": batch.unbilled_output_tokens,
        "unbilled_cost_nanos": unbilled_cost(batch).total_nanos,
    }


# ---------------------------------------------------------------------------
# Reading the ledger: totals for the usage endpoint and the admin pages.


def day_range(start, end):
    """Entries billed from `start` to `end` (dates, both included, UTC).

    Bounds on the column itself (not created_at__date) keep the index usable;
    time.max rather than "next midnight" works for date.max too.
    """
    return {
        "created_at__gte": datetime.combine(start, time.min, tzinfo=UTC),
        "created_at__lte": datetime.combine(end, time.max, tzinfo=UTC),
    }


def totals_by_day_and_model(organization, start, end):
    """[{"day", "model_name", "batches", tokens..., "cost"}] ordered by day, then model."""
    entries = LedgerEntry.objects.filter(organization=organization, **day_range(start, end))
    return _totals(entries.annotate(day=TruncDate("created_at")), ("day", "model_name"), ("day", "model_name"))


def totals_by_month_and_model(organization):
    """[{"month", "model_name", "batches", tokens..., "cost"}], newest month first."""
    entries = LedgerEntry.objects.filter(organization=organization).annotate(month=TruncMonth("created_at"))
    return _totals(entries, ("month", "model_name"), ("-month", "model_name"))


def totals_by_model(organization):
    """[{"model_name", "batches", tokens..., "cost"}] over the organization's whole ledger."""
    return _totals(LedgerEntry.objects.filter(organization=organization), ("model_name",), ("model_name",))


def _totals(entries, keys, order):
    sums = {name: Sum(name) for name in TOKEN_SUMS + COST_SUMS + UNBILLED_SUMS}
    rows = entries.values(*keys).annotate(batches=Count("id"), **sums).order_by(*order)
    return [_total_row(row) for row in rows]


def _total_row(row):
    # PostgreSQL sums bigints as numeric (Decimal); the amounts are whole.
    for name in TOKEN_SUMS + COST_SUMS + UNBILLED_SUMS:
        row[name] = int(row[name] or 0)
    row["cost"] = Cost(*(row.pop(name) for name in COST_SUMS))
    return row


def grand_total(rows):
    """Sum rows made by the functions above into one (same fields, no keys)."""
    total = {"batches": sum(row["batches"] for row in rows)}
    for name in TOKEN_SUMS + UNBILLED_SUMS:
        total[name] = sum(row[name] for row in rows)
    total["cost"] = sum((row["cost"] for row in rows), Cost())
    return total
