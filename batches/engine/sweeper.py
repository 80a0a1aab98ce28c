"""The periodic sweeper (a django-q2 schedule).

Workers handle the common paths themselves (they reclaim dead leases of the
batch they work on, finalize when done, stop on cancel). The sweeper covers
what no live worker will: batches whose every worker died, batches past
their window, cancellations, and closes interrupted mid-way.
"""

import logging
from datetime import timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from batches.engine import finish, store
from batches.models import Batch, BatchStatus
from batches.tasks import enqueue_batch

logger = logging.getLogger("openrelay.engine")

# A close (finalize) that has not committed after this long was interrupted.
STUCK_FINALIZING = timedelta(minutes=5)


def sweep(now=None):
    now = now or timezone.now()
    report = {"expired": 0, "cancelled": 0, "requeued": 0, "finalized": 0}
    for batch in Batch.objects.filter(status=BatchStatus.CANCELLING).select_related("organization"):
        report["cancelled"] += bool(finish.complete_cancellation(batch))
    for batch in Batch.objects.filter(status=BatchStatus.IN_PROGRESS, expires_at__lte=now).select_related("organization"):
        report["expired"] += bool(finish.expire_if_due(batch))
    for batch in Batch.objects.filter(status=BatchStatus.FINALIZING, finalizing_at__lte=now - STUCK_FINALIZING):
        report["finalized"] += bool(_reclose(batch))
    for batch in _orphaned(now):
        if store.claimable(batch.pk, now).exists():
            _requeue(batch, now)
            report["requeued"] += 1
        else:
            report["finalized"] += bool(finish.finalize_if_done(batch))
    return report


def _orphaned(now):
    """In-progress or validating batches no worker has reported on lately."""
    quiet = now - timedelta(seconds=2 * settings.OPENRELAY_LEASE_S)
    return Batch.objects.filter(status__in=(BatchStatus.IN_PROGRESS, BatchStatus.VALIDATING)).filter(
        Q(worker_seen_at__isnull=True) | Q(worker_seen_at__lt=quiet),
        Q(enqueued_at__isnull=True) | Q(enqueued_at__lt=quiet),
    )


def _requeue(batch, now):
    logger.info("re-queueing batch %s: no live worker", batch.public_id)
    Batch.objects.filter(pk=batch.pk).update(enqueued_at=now)
    enqueue_batch(batch.pk, copies=settings.OPENRELAY_TASKS_PER_BATCH)


def _reclose(batch):
    status = BatchStatus.EXPIRED if batch.expires_at <= batch.finalizing_at else BatchStatus.COMPLETED
    return finish.close(batch, status)
