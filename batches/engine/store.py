"""The engine's database operations: claims with leases, bulk flushes, renewals.

All of these are synchronous and run on the worker's one database thread.
The database is the ledger: a record is someone's only while its lease
lives, and every write is conditional on still holding it, so a worker that
lost its lease (it stalled, the sweeper re-queued the record) can never
write a second outcome for the record.
"""

from dataclasses import dataclass
from datetime import timedelta

import orjson
from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from batches.models import Batch, Record, RecordStatus

RESULT_FIELDS = [
    "status",
    "status_code",
    "request_id",
    "response_body",
    "error_code",
    "error_message",
    "finished_at",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "lease_owner",
    "lease_expires_at",
]


@dataclass(frozen=True)
class ClaimedRecord:
    pk: int
    line: int
    custom_id: str
    offset: int
    length: int


def claimable(batch_pk, now):
    """Pending records, and running ones whose worker's lease ran out."""
    return Record.objects.filter(batch_id=batch_pk).filter(
        Q(status=RecordStatus.PENDING) | Q(status=RecordStatus.RUNNING, lease_expires_at__lt=now)
    )


def claim(batch_pk, owner, limit, lease_s=None):
    now = timezone.now()
    lease_until = now + timedelta(seconds=lease_s or settings.OPENRELAY_LEASE_S)
    with transaction.atomic():
        # SKIP LOCKED lets several workers claim disjoint chunks of one batch
        # at once on PostgreSQL; SQLite ignores it and serialises writers.
        ids = list(
            claimable(batch_pk, now).order_by("line").select_for_update(skip_locked=True).values_list("pk", flat=True)[:limit]
        )
        if not ids:
            return []
        Record.objects.filter(pk__in=ids).update(
            status=RecordStatus.RUNNING, lease_owner=owner, lease_expires_at=lease_until, attempts=F("attempts") + 1
        )
        rows = Record.objects.filter(pk__in=ids).order_by("line").values_list("pk", "line", "custom_id", "offset", "length")
        return [ClaimedRecord(*row) for row in rows]


def renew(batch_pk, owner, lease_s=None):
    now = timezone.now()
    lease_until = now + timedelta(seconds=lease_s or settings.OPENRELAY_LEASE_S)
    Record.objects.filter(batch_id=batch_pk, lease_owner=owner, status=RecordStatus.RUNNING).update(
        lease_expires_at=lease_until
    )
    Batch.objects.filter(pk=batch_pk).update(worker_seen_at=now)


def release(batch_pk, owner, pks):
    """Give records back (this worker is stopping before running them)."""
    Record.objects.filter(batch_id=batch_pk, lease_owner=owner, status=RecordStatus.RUNNING, pk__in=pks).update(
        status=RecordStatus.PENDING, lease_owner="", lease_expires_at=None
    )


def batch_status(batch_pk):
    """Read the status and report this worker alive (the sweeper and priority use it)."""
    Batch.objects.filter(pk=batch_pk).update(worker_seen_at=timezone.now())
    return Batch.objects.filter(pk=batch_pk).values_list("status", flat=True).first()


def expedited_waiting(now=None, quiet_s=5):
    """Is an expedited batch waiting for a worker (queued, or no worker seen lately)?"""
    from batches.models import BatchStatus, Priority

    now = now or timezone.now()
    waiting = Batch.objects.filter(priority=Priority.EXPEDITED).filter(
        Q(status=BatchStatus.VALIDATING)
        | Q(status=BatchStatus.IN_PROGRESS)
        & (Q(worker_seen_at__isnull=True) | Q(worker_seen_at__lt=now - timedelta(seconds=quiet_s)))
    )
    return any(claimable(pk, now).exists() for pk in waiting.values_list("pk", flat=True)[:5])


def flush(batch_pk, owner, outcomes):
    """Store finished records and roll their counts and usage up into the batch.

    `outcomes` is a list of (ClaimedRecord, RecordOutcome). Returns how many
    were written (records whose lease this worker no longer holds are skipped).
    """
    if not outcomes:
        return 0
    now = timezone.now()
    with transaction.atomic():
        held = set(
            Record.objects.select_for_update()
            .filter(pk__in=[claimed.pk for claimed, _ in outcomes], lease_owner=owner, status=RecordStatus.RUNNING)
            .values_list("pk", flat=True)
        )
        rows = [_result_row(claimed.pk, outcome, now) for claimed, outcome in outcomes if claimed.pk in held]
        if not rows:
            return 0
        Record.objects.bulk_update(rows, RESULT_FIELDS, batch_size=500)
        _roll_up(batch_pk, rows)
    return len(rows)


def _result_row(pk, outcome, now):
    return Record(
        pk=pk,
        status=RecordStatus.SUCCEEDED if outcome.succeeded else RecordStatus.FAILED,
        status_code=outcome.status_code,
        request_id=outcome.request_id,
        response_body=orjson.dumps(outcome.body).decode() if outcome.body is not None else "",
        error_code=outcome.error_code,
        error_message=outcome.error_message,
        finished_at=now,
        prompt_tokens=outcome.usage.prompt_tokens,
        cached_tokens=outcome.usage.cached_tokens,
        completion_tokens=outcome.usage.completion_tokens,
        reasoning_tokens=outcome.usage.reasoning_tokens,
        lease_owner="",
        lease_expires_at=None,
    )


def _roll_up(batch_pk, rows):
    """One atomic UPDATE with F() expressions: never read-modify-write."""
    succeeded = sum(1 for r in rows if r.status == RecordStatus.SUCCEEDED)
    Batch.objects.filter(pk=batch_pk).update(
        completed_count=F("completed_count") + succeeded,
        failed_count=F("failed_count") + (len(rows) - succeeded),
        input_tokens=F("input_tokens") + sum(r.prompt_tokens for r in rows),
        cached_tokens=F("cached_tokens") + sum(r.cached_tokens for r in rows),
        output_tokens=F("output_tokens") + sum(r.completion_tokens for r in rows),
        reasoning_tokens=F("reasoning_tokens") + sum(r.reasoning_tokens for r in rows),
    )


def unfinished_count(batch_pk):
    return Record.objects.filter(batch_id=batch_pk, status__in=(RecordStatus.PENDING, RecordStatus.RUNNING)).count()


def close_unfinished(batch_pk, status, code, message):
    """Mark every pending/running record of the batch as `status` (expired/cancelled).

    Counted as failed: they are error-file lines.
    """
    now = timezone.now()
    with transaction.atomic():
        closed = Record.objects.filter(
            batch_id=batch_pk, status__in=(RecordStatus.PENDING, RecordStatus.RUNNING)
        ).update(
            status=status, error_code=code, error_message=message, finished_at=now, lease_owner="", lease_expires_at=None
        )
        if closed:
            Batch.objects.filter(pk=batch_pk).update(failed_count=F("failed_count") + closed)
    return closed
