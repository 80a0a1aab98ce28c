"""Reads of batches the dashboard makes: the list with its search, filters and pages; a batch's failures.

The list is keyset-paged by (created_at, pk), newest first, like the API's.
"""

import json
from contextlib import contextmanager
from dataclasses import dataclass

from django.db import connection, transaction
from django.db.models import Count, Q
from django.db.models.fields.json import KeyTextTransform

from batches.models import Batch, Record, RecordStatus
from batches.results import failure_code
from openrelay.api.pagination import cursor_page

UNRUN_STATUSES = (RecordStatus.EXPIRED, RecordStatus.CANCELLED)
ERROR_STATUSES = (RecordStatus.FAILED, *UNRUN_STATUSES)


@dataclass(frozen=True)
class BatchFilters:
    q: str = ""
    status: str = ""
    endpoint: str = ""
    model: str = ""

    @property
    def active(self):
        return any((self.q, self.status, self.endpoint, self.model))


@dataclass
class BatchPage:
    batches: list
    older: str | None  # the cursor of the next (older) page, if there is one
    newer: str | None  # the cursor of the previous (newer) page, if there is one


def filtered(batches, filters):
    if filters.status:
        batches = batches.filter(status=filters.status)
    if filters.endpoint:
        batches = batches.filter(endpoint=filters.endpoint)
    if filters.model:
        batches = batches.filter(model_name=filters.model)
    if filters.q:
        batches = batches.filter(_search(filters.q.strip()))
    return batches


def _search(q):
    """`key=value`: batches whose metadata has that key with that value (any case). Anything else:
    batches whose id or metadata (keys or values) contain the text."""
    key, sep, value = q.partition("=")
    if sep and key.strip():
        return Q(
            pk__in=Batch.objects.alias(value=KeyTextTransform(key.strip(), "metadata"))
            .filter(value__iexact=value.strip())
            .values("pk")
        )
    # SQLite stores JSON with non-ASCII characters and quotes escaped: look for that spelling too.
    escaped = json.dumps(q)[1:-1]
    return Q(public_id__icontains=q) | Q(metadata__icontains=q) | Q(metadata__icontains=escaped)


def page(organization, filters, *, after=None, before=None, size, related=()):
    """One page of the organization's batches matching `filters`, newest first.

    Raises Batch.DoesNotExist for a cursor that is not one of the organization's batches.
    """
    own = Batch.objects.for_org(organization)
    batches = filtered(own.select_related(*related), filters)
    no_cursor = Batch.DoesNotExist(f"No batch {after or before} in this organization.")
    if before:
        # The newer page: the `size` batches just after the cursor, oldest first, shown newest first.
        found, more = cursor_page(batches, limit=size, after=before, order="asc", cursors=own, no_cursor=no_cursor)
        rows = found[::-1]
        return BatchPage(rows, older=rows[-1].public_id if rows else None, newer=rows[0].public_id if more else None)
    rows, more = cursor_page(batches, limit=size, after=after, cursors=own, no_cursor=no_cursor)
    return BatchPage(
        rows, older=rows[-1].public_id if more else None, newer=rows[0].public_id if after and rows else None
    )


def models_used(organization):
    """The models the organization's batches ran on, for the list's filter."""
    return list(
        Batch.objects.for_org(organization)
        .exclude(model_name="")
        .order_by("model_name")
        .values_list("model_name", flat=True)
        .distinct()
    )


@dataclass
class Failures:
    codes: list  # [{"code", "count", "unrun"}], most first
    failed: int  # error lines of records that ran
    unrun: int  # error lines of records a cancel or an expiry closed before they ran

    @property
    def total(self):
        return self.failed + self.unrun


def failures(batch_pk):
    """A batch's error lines by failure code (as the error file shows them: results.failure_code).

    One grouped read of the batch's records in error statuses (the
    batch/status/line index); ~2,800 failures read in a few ms.
    """
    rows = (
        Record.objects.filter(batch_id=batch_pk, status__in=ERROR_STATUSES)
        .values_list("status", "error_code", "status_code")
        .annotate(n=Count("pk"))
        .order_by()
    )
    by_code, failed, unrun = {}, 0, 0
    for status, error_code, status_code, n in rows:
        code = failure_code(error_code, status_code)
        entry = by_code.setdefault(code, {"code": code, "count": 0, "unrun": False})
        entry["count"] += n
        if status in UNRUN_STATUSES:
            entry["unrun"] = True
            unrun += n
        else:
            failed += n
    codes = sorted(by_code.values(), key=lambda entry: (-entry["count"], entry["code"]))
    return Failures(codes, failed, unrun)


def failures_with(read):
    """`read()` (a Batch, or None) and that batch's failures (or None), as of one moment.

    The engines write a batch's records and its rolled-up counters in one
    transaction (batches.engine.store); read apart, the failed tile and the
    failures card showed two moments (15 vs 16 failed while a batch ran).
    """
    with _one_moment():
        batch = read()
        return batch, None if batch is None else failures(batch.pk)


@contextmanager
def _one_moment():
    """Reads that see one committed state: a read-only REPEATABLE READ transaction on PostgreSQL
    (READ COMMITTED gives each statement its own); a deferred one on SQLite, whose WAL keeps a
    reader on the snapshot of its first read (atomic() would BEGIN IMMEDIATE, the settings'
    transaction_mode, and hold writers off). Inside a transaction already, the reads share it."""
    if connection.in_atomic_block:
        yield
    elif connection.vendor == "postgresql":
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            yield
    else:
        with connection.cursor() as cursor:
            cursor.execute("BEGIN DEFERRED")
            try:
                yield
            finally:
                cursor.execute("COMMIT")
