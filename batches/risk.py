"""A running batch's expected completion, and its `batch.at_risk` event when that passes its window.

The expected completion is the dashboard's ETA, now in the API: the records
left at the pace of the batch's last minute (batches.progress). Every
minute a q2 schedule (batches.tasks.warn_at_risk) reads the running
batches' and sends `batch.at_risk` once for each whose expected completion
is past its expires_at, with the figures, so a user can act before expiry
(cancel, resubmit expedited, split). `Batch.at_risk_at` makes it once: a
conditional update only one run can win.
"""

from datetime import UTC, datetime

from django.db import transaction
from django.utils import timezone

from batches import progress
from batches.models import Batch, BatchStatus
from webhooks import services as webhooks


def expected_completion(batch, now=None):
    """When the batch is expected to finish (an aware datetime), or None: not running, stalled,
    or its samples not loaded (live snapshots defer them)."""
    if batch.status != BatchStatus.IN_PROGRESS or "progress" in batch.get_deferred_fields():
        return None
    now = now or timezone.now()
    done = batch.completed_count + batch.failed_count
    start = batch.in_progress_at.timestamp() if batch.in_progress_at else None
    rate = progress.rate(progress.series(start, batch.progress), now.timestamp(), done)
    left_s = progress.eta_s(rate, batch.total_count - done)
    if left_s is None:
        return None
    return datetime.fromtimestamp(now.timestamp() + left_s, tz=UTC)


def warn_at_risk(now=None):
    """Send `batch.at_risk` for each running batch newly expected to finish past its window; returns their pks."""
    now = now or timezone.now()
    running = Batch.objects.filter(status=BatchStatus.IN_PROGRESS, at_risk_at__isnull=True).only(
        "pk",
        "public_id",
        "organization_id",
        "status",
        "expires_at",
        "in_progress_at",
        "total_count",
        "completed_count",
        "failed_count",
        "progress",
    )
    warned = []
    # Read whole before writing: a warning commits (and may enqueue its delivery) between batches.
    for batch in list(running):
        expected = expected_completion(batch, now)
        if expected is not None and expected > batch.expires_at and _warn_once(batch, expected, now):
            warned.append(batch.pk)
    return warned


def warn_at_admission(batch, now):
    """`batch.at_risk` for a batch its admission (batches.estimate.admission) found late, sent with its
    create's transaction: the quote's expected completion, nothing run yet."""
    expected = datetime.fromtimestamp(batch.admission["expected_completion_at"], tz=UTC)
    Batch.objects.filter(pk=batch.pk).update(at_risk_at=now)
    batch.at_risk_at = now
    webhooks.batch_at_risk(batch, {**figures(batch, expected, now), "source": "admission"}, now)


def _warn_once(batch, expected, now):
    with transaction.atomic():
        if not Batch.objects.filter(pk=batch.pk, at_risk_at__isnull=True).update(at_risk_at=now):
            return False  # another run warned first
        webhooks.batch_at_risk(batch, figures(batch, expected, now), now)
    return True


def figures(batch, expected, now):
    done = batch.completed_count + batch.failed_count
    elapsed = now.timestamp() - batch.in_progress_at.timestamp() if batch.in_progress_at else 0
    return {
        "expected_completion_at": int(expected.timestamp()),
        "expires_at": int(batch.expires_at.timestamp()),
        "request_counts": {
            "total": batch.total_count,
            "completed": batch.completed_count,
            "failed": batch.failed_count,
        },
        # Records left when the window ends, at the pace the expected completion was read from.
        "records_left_at_expiry": max(0, round((batch.total_count - done) * _share_late(expected, batch, now))),
        "running_s": round(elapsed, 1),
    }


def _share_late(expected, batch, now):
    total = expected.timestamp() - now.timestamp()
    late = expected.timestamp() - batch.expires_at.timestamp()
    return late / total if total > 0 else 1.0
