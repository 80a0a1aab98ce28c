"""Progress samples, written by the engines beside their flushes (batches.progress says what they are).

An engine takes a sample of a batch at most every SAMPLE_EVERY_S while it
writes the batch's records, in its own short transaction after the flush
committed (so the counts it reads include that flush): the batch rows are
locked in id order, as the flush locks them, and a sample another engine
took less than SAMPLE_EVERY_S ago makes this one a no-op. Cost: one
SELECT ... FOR UPDATE of the batches due and one UPDATE of each (~3 KB of
JSON at most), every 2 s a batch.
"""

from django.db import transaction
from django.utils import timezone

from batches import progress
from batches.models import Batch, BatchStatus


def take(batch_pks):
    """Append a sample of each batch's counts now; returns the pks that got one."""
    if not batch_pks:
        return []
    now = timezone.now().timestamp()
    sampled = []
    with transaction.atomic():
        # In progress only: a cancel or an expiry counts the records it closes unrun as failed
        # before the close takes the last sample without them (finish._final_progress).
        rows = (Batch.objects.filter(pk__in=batch_pks, status=BatchStatus.IN_PROGRESS).order_by("pk")
                .select_for_update().values_list("pk", "progress", "completed_count", "failed_count"))
        for pk, samples, completed, failed in rows:
            updated = progress.appended(samples, now, completed, failed)
            if updated is not None:
                Batch.objects.filter(pk=pk).update(progress=updated)
                sampled.append(pk)
    return sampled
