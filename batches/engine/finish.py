"""Closing a batch: finalize, expire, complete a cancellation.

Each ends with one atomic step that creates the result File rows and makes
the terminal transition together (which bills the batch and records its
webhook events and live event: batches.lifecycle). The transition is conditional, so when two
processes race to close a batch, exactly one commits; the other rolls back
and removes the bytes it stored. Finalizing twice never writes twice.
"""

import logging
from datetime import timedelta

from django.core.files.storage import default_storage
from django.db import transaction
from django.utils import timezone

from batches import lifecycle, progress, results
from batches.engine import cut
from batches.models import Batch, BatchStatus, Record, RecordStatus
from files import services as file_services
from files.models import Purpose
from files.responses import stream_size

logger = logging.getLogger("openrelay.engine")


class _LostRace(Exception):
    pass


def finalize_if_done(batch):
    batch.refresh_from_db()
    if batch.status == BatchStatus.CANCELLING:
        return complete_cancellation(batch)
    if batch.status != BatchStatus.IN_PROGRESS:
        return False
    if expire_if_due(batch):
        return True
    if cut.unfinished_count(batch.pk):
        return False
    if not lifecycle.transition(batch, BatchStatus.FINALIZING):
        return False
    return close(batch, BatchStatus.COMPLETED)


def expire_if_due(batch):
    if batch.status != BatchStatus.IN_PROGRESS or batch.expires_at > timezone.now():
        return False
    if not lifecycle.transition(batch, BatchStatus.FINALIZING):
        return False
    cut.close_unfinished(batch.pk, RecordStatus.EXPIRED, "batch_expired", results.EXPIRED_MESSAGE)
    return close(batch, BatchStatus.EXPIRED)


def complete_cancellation(batch):
    if batch.status != BatchStatus.CANCELLING:
        return False
    cut.close_unfinished(batch.pk, RecordStatus.CANCELLED, "batch_cancelled", results.CANCELLED_MESSAGE)
    return close(batch, BatchStatus.CANCELLED)


def close_finalizing(batch):
    """Close a batch left finalizing (its close failed, or its engine died mid-way): expired if its
    window had passed when it began to (its unfinished records cut again: idempotent), else completed."""
    if batch.expires_at <= batch.finalizing_at:
        cut.close_unfinished(batch.pk, RecordStatus.EXPIRED, "batch_expired", results.EXPIRED_MESSAGE)
        return close(batch, BatchStatus.EXPIRED)
    return close(batch, BatchStatus.COMPLETED)


def close_again(batch):
    """A close that raised (its storage or database away), tried again from wherever it stopped."""
    batch.refresh_from_db()
    if batch.status == BatchStatus.FINALIZING:
        return close_finalizing(batch)
    return finalize_if_done(batch)


def close(batch, final_status):
    """Write the result files and make the terminal transition, atomically."""
    rendered = results.render(batch)
    stored = []
    try:
        with transaction.atomic():
            output_file = _store(batch, rendered.output, "output", stored)
            error_file = _store(batch, rendered.error, "error", stored)
            now = timezone.now()
            if not lifecycle.transition(
                batch,
                final_status,
                now=now,
                output_file=output_file,
                error_file=error_file,
                progress=_final_progress(batch, now),
            ):
                raise _LostRace
            if batch.input_file_id:
                file_services.unpin(batch.input_file_id)
    except BaseException as exc:
        # Rolled back (a lost race or a crash): the rows are gone, so are the bytes.
        for name in stored:
            default_storage.delete(name)
        if isinstance(exc, _LostRace):
            return False
        raise
    finally:
        rendered.close()
    return True


def _final_progress(batch, now):
    """The batch's progress samples ending at its finish (whole seconds, as the API shows the time):
    the records that ran, without those the close marked expired or cancelled unrun."""
    samples, completed, failed = (
        Batch.objects.select_for_update()
        .filter(pk=batch.pk)
        .values_list("progress", "completed_count", "failed_count")
        .get()
    )
    unrun = Record.objects.filter(batch_id=batch.pk, status__in=(RecordStatus.EXPIRED, RecordStatus.CANCELLED)).count()
    return progress.final(samples, int(now.timestamp()), completed, failed - unrun)


def _store(batch, stream, kind, stored):
    if stream is None:
        return None
    now = timezone.now()
    ttl = (
        timedelta(seconds=batch.output_expires_after_s)
        if batch.output_expires_after_s
        else file_services.DEFAULT_OUTPUT_TTL
    )
    size = stream_size(stream)
    file = file_services.create_file_from_stream(
        organization=batch.organization,
        filename=f"{batch.public_id}_{kind}.jsonl",
        purpose=Purpose.BATCH_OUTPUT,
        stream=stream,
        size=size,
        expires_at=now + ttl,
    )
    stored.append(file.storage_name)
    return file
