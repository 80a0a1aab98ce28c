"""Progress samples, written by the engines beside their flushes (batches.progress says what they are).

An engine takes a sample of a batch at most every SAMPLE_EVERY_S while it
writes the batch's records, in its own short transaction after the flush
committed (so the counts it reads include that flush): the batch rows are
locked in id order, as the flush locks them, and a sample another engine
took less than SAMPLE_EVERY_S ago makes this one a no-op. Cost: one
SELECT ... FOR UPDATE of the batches due and one UPDATE of them all (~3 KB
of JSON a batch at most), every 2 s a batch (tests/perf/bench_dashboard.py).
"""

import orjson
from django.db import connection, transaction
from django.utils import timezone

from batches import progress
from batches.models import Batch, BatchStatus


def take(batch_pks):
    """Append a sample of each batch's counts now; returns the pks that got one."""
    if not batch_pks:
        return []
    now = timezone.now().timestamp()
    with transaction.atomic():
        # In progress only: a cancel or an expiry counts the records it closes unrun as failed
        # before the close takes the last sample without them (finish._final_progress).
        rows = (
            Batch.objects.filter(pk__in=batch_pks, status=BatchStatus.IN_PROGRESS)
            .order_by("pk")
            .select_for_update()
            .values_list("pk", "progress", "completed_count", "failed_count")
        )
        updates = {}
        for pk, samples, completed, failed in rows:
            updated = progress.appended(samples, now, completed, failed)
            if updated is not None:
                updates[pk] = orjson.dumps(updated).decode()
        _write(updates)
    return list(updates)


def _write(updates):
    """Every batch's samples in one statement (an UPDATE each cost ~0.5 ms on PostgreSQL)."""
    if not updates:
        return
    table = connection.ops.quote_name(Batch._meta.db_table)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                f"UPDATE {table} AS b SET progress = v.progress FROM unnest(%s::bigint[], %s::jsonb[]) "
                f"AS v(id, progress) WHERE b.id = v.id",
                [list(updates), list(updates.values())],
            )
        else:
            cursor.executemany(
                f"UPDATE {table} SET progress = %s WHERE id = %s", [(text, pk) for pk, text in updates.items()]
            )
