"""The batch state machine: every status change goes through `transition`.

validating -> in_progress -> finalizing -> completed
validating -> failed                      (every record rejected)
validating | in_progress -> cancelling -> cancelled
in_progress -> finalizing -> expired      (window passed; unfinished records expired)

Transitions are conditional UPDATEs on the current status, so two processes
racing to move one batch cannot both win. A batch's terminal side effects
(webhook events, the ledger entry, the live event) live here too, in `_ended`:
whoever ends a batch (the engine's close, create's all-rejected failure) gets
all of them, in the transaction that ends it.
"""

from django.db import transaction
from django.utils import timezone

from batches.dashboard import events
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
    with transaction.atomic():
        won = Batch.objects.filter(pk=batch.pk, status=source).update(**values) == 1
        if won and target in TERMINAL_BATCH_STATUSES:
            _ended(batch, target, now)
    if won:
        for name, value in values.items():
            setattr(batch, name, value)
    return won


def _ended(batch, status, now):
    """Everything that follows a batch's end, born in its transaction: a batch that ends has its
    webhook deliveries and its ledger entry, one whose end rolls back has neither."""
    webhooks.batch_finished(batch, status, now)
    if status != S.FAILED:
        # A failed batch ran nothing (create rejected every record): no entry. The others are
        # billed once, for what ran (billing/ledger.py reads the final counters).
        entry = ledger.bill_batch(batch)
        Batch.objects.filter(pk=batch.pk).update(billed_at=entry.created_at)
    # robust: a channel-layer hiccup must not undo the end.
    transaction.on_commit(lambda: events.batch_changed_sync(batch.pk), robust=True)
