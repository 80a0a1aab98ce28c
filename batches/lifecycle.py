"""The batch state machine: every status change goes through `transition`.

validating -> in_progress -> finalizing -> completed
validating -> failed                      (every record rejected)
validating | in_progress -> cancelling -> cancelled
in_progress -> finalizing -> expired      (window passed; unfinished records expired)

Pause is a state beside these: a validating or in_progress batch is
running or paused (`paused_at`). Paused, it claims no records; calls in flight
finish and are billed; its window clock runs on, so it expires as usual; cancel
works as ever. Its status stays OpenAI's (the SDKs know eight), and the batch
object's `openrelay.paused` says why and since when. `pause` and `resume` are
conditional UPDATEs too: of two pausers one wins and one `batch.paused` event
is sent. Any status change that leaves validating / in_progress ends the pause.

Transitions are conditional UPDATEs on the current status, so two processes
racing to move one batch cannot both win. A batch's terminal side effects
(webhook events, the ledger entry, the live event) live here too, in `_ended`:
whoever ends a batch (the engine's close, create's all-rejected failure) gets
all of them, in the transaction that ends it.
"""

from django.db import transaction
from django.utils import timezone

from batches import latency, live, tallies
from batches.models import TERMINAL_BATCH_STATUSES, Batch
from batches.models import BatchStatus as S
from billing import ledger
from webhooks import services as webhooks

ALLOWED = {
    S.VALIDATING: {S.IN_PROGRESS, S.FAILED, S.CANCELLING},
    S.IN_PROGRESS: {S.FINALIZING, S.CANCELLING},
    S.FINALIZING: {S.COMPLETED, S.EXPIRED},
    S.CANCELLING: {S.CANCELLED},
    S.COMPLETED: set(),
    S.FAILED: set(),
    S.EXPIRED: set(),
    S.CANCELLED: set(),
}

TIMESTAMP_FIELD = {
    S.IN_PROGRESS: "in_progress_at",
    S.FINALIZING: "finalizing_at",
    S.COMPLETED: "completed_at",
    S.FAILED: "failed_at",
    S.EXPIRED: "expired_at",
    S.CANCELLING: "cancelling_at",
    S.CANCELLED: "cancelled_at",
}


# A cancel answers this long after it committed, and by then no engine sends a call of the batch: an
# engine sends one only within half of it of a read that found the batch running (batches.engine.fence).
CANCEL_FENCE_S = 1.5

# The statuses in which a batch may be paused (and is resumed).
PAUSABLE = (S.VALIDATING, S.IN_PROGRESS)


class IllegalTransition(Exception):
    pass


def check(source, target):
    if target not in ALLOWED[source]:
        raise IllegalTransition(f"A batch cannot go from {source} to {target}.")


def transition(batch, target, *, now=None, **fields):
    """Move `batch` from its current status to `target`; return True if this call won.

    Returns False when another process changed the status first (the row no
    longer has the status this instance holds). `fields` are written in the
    same UPDATE.
    """
    source = batch.status
    check(source, target)
    now = now or timezone.now()
    values = {"status": target, TIMESTAMP_FIELD[target]: now, **fields}
    if target not in PAUSABLE:
        values["paused_at"] = None  # cancelling, finalizing or ended: no longer paused (the reason stays)
    with transaction.atomic():
        won = Batch.objects.filter(pk=batch.pk, status=source).update(**values) == 1
        if won and target in TERMINAL_BATCH_STATUSES:
            _ended(batch, target, now)
    if won:
        for name, value in values.items():
            setattr(batch, name, value)
    return won


def pause(batch, reason, *, detail=None, now=None):
    """Pause a running batch; return True if this call paused it.

    False when it was paused already (the first reason stands) or is no longer
    validating / in progress. `detail`: {message, code?, line?, ...} for its owner.
    """
    now = now or timezone.now()
    values = {"paused_at": now, "pause_reason": reason, "pause_detail": detail}
    with transaction.atomic():
        won = Batch.objects.filter(pk=batch.pk, status__in=PAUSABLE, paused_at__isnull=True).update(**values) == 1
        if won:
            _switched(batch, "batch.paused", f"pauses|{reason}", now)
    if won:
        for name, value in values.items():
            setattr(batch, name, value)
    return won


def resume(batch, *, now=None, **fields):
    """Resume a paused batch (writing `fields` in the same UPDATE, e.g. a new cap); True if
    this call resumed it, False when it was not paused or is no longer running."""
    now = now or timezone.now()
    values = {"paused_at": None, "resumed_at": now, **fields}
    with transaction.atomic():
        won = Batch.objects.filter(pk=batch.pk, status__in=PAUSABLE, paused_at__isnull=False).update(**values) == 1
        if won:
            _switched(batch, "batch.resumed", "resumes", now)
    if won:
        for name, value in values.items():
            setattr(batch, name, value)
    return won


def _switched(batch, event_type, tally, now):
    """A pause or a resume's side effects, in its transaction: the webhook event, the count
    GET /metrics shows, and (after the commit) the live event."""
    webhooks.batch_event(batch, event_type, now)
    tallies.save({tally: 1})
    transaction.on_commit(lambda: live.batch_changed_sync(batch.pk), robust=True)


def _ended(batch, status, now):
    """Everything that follows a batch's end, born in its transaction: a batch that ends has its
    webhook deliveries and its ledger entry, one whose end rolls back has neither."""
    webhooks.batch_finished(batch, status, now)
    if status != S.FAILED:
        # A failed batch ran nothing (create rejected every record): no entry. The others are
        # billed once, for what ran (billing/ledger.py reads the final counters).
        entry = ledger.bill_batch(batch)
        Batch.objects.filter(pk=batch.pk).update(billed_at=entry.created_at)
    if status == S.COMPLETED:
        tallies.save(latency.observed(batch, now))  # GET /metrics' latency histograms, once a batch
    # robust: a channel-layer hiccup must not undo the end.
    transaction.on_commit(lambda: live.batch_changed_sync(batch.pk), robust=True)
