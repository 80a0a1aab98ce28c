"""The periodic sweeper (a django-q2 schedule): a safety net, not the path by which work resumes.

Engines do the common paths themselves: they pick up new batches, reclaim
dead engines' leases, close batches that are done, cancelled or past their
window. The sweeper covers what no live engine did: a close interrupted
mid-way, or a batch whose closing engine died (engines close batches only
through their first-ranked engine).
"""

import logging
from datetime import timedelta

from django.db.models import F
from django.utils import timezone

from batches.engine import finish
from batches.models import Batch, BatchStatus

logger = logging.getLogger("openrelay.engine")

# A close (finalize) that has not committed after this long was interrupted.
STUCK_FINALIZING = timedelta(minutes=5)


def sweep(now=None):
    now = now or timezone.now()
    report = {"expired": 0, "cancelled": 0, "finalized": 0}
    for batch in Batch.objects.filter(status=BatchStatus.CANCELLING).select_related("organization"):
        report["cancelled"] += bool(finish.complete_cancellation(batch))
    for batch in Batch.objects.filter(status=BatchStatus.IN_PROGRESS, expires_at__lte=now).select_related(
        "organization"
    ):
        report["expired"] += bool(finish.expire_if_due(batch))
    for batch in Batch.objects.filter(status=BatchStatus.FINALIZING, finalizing_at__lte=now - STUCK_FINALIZING):
        report["finalized"] += bool(finish.close_finalizing(batch))
    done = Batch.objects.filter(
        status=BatchStatus.IN_PROGRESS, total_count__lte=F("completed_count") + F("failed_count")
    )
    for batch in done.select_related("organization"):
        report["finalized"] += bool(finish.finalize_if_done(batch))
    return report
