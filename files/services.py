"""Writes that involve File rows and their stored bytes.

Bytes live in Django's default storage (a folder under OPENRELAY_DATA_DIR by
default); a File row exists only once its bytes are fully stored.
"""

import os
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.core.files.base import File as DjangoFile
from django.core.files.storage import default_storage
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from files import storage
from files.models import File, Purpose
from openrelay.api.errors import Conflict

DEFAULT_BATCH_INPUT_TTL = timedelta(days=30)
DEFAULT_OUTPUT_TTL = timedelta(days=30)
EXPIRES_AFTER_MIN_S = 3600
EXPIRES_AFTER_MAX_S = 30 * 24 * 3600
# Expired files are deleted this many at a time, so one sweep never holds
# a long transaction or a huge list in memory.
EXPIRY_SWEEP_CHUNK = 500


def _storage_name(organization, public_id):
    return f"org-{organization.pk}/{public_id}.jsonl"


def create_file_from_stream(*, organization, filename, purpose, stream, size, expires_at=None, created_at=None):
    """Store a binary stream (a Django UploadedFile, a temp file) and create its row."""
    file = File(organization=organization, filename=filename[:255], purpose=purpose, bytes=size, expires_at=expires_at)
    if created_at is not None:
        file.created_at = created_at
    # A Django File passes through as is, so a TemporaryUploadedFile keeps its
    # temporary_file_path() and FileSystemStorage moves it instead of copying.
    content = stream if isinstance(stream, DjangoFile) else DjangoFile(stream)
    file.storage_name = default_storage.save(_storage_name(organization, file.public_id), content)
    try:
        file.save()
    except BaseException:
        default_storage.delete(file.storage_name)
        raise
    return file


def create_file_from_chunks(*, organization, filename, purpose, chunks, expires_at=None):
    """Store an iterable of bytes chunks as a new File (inline requests, result files)."""
    with tempfile.TemporaryFile() as tmp:
        size = 0
        for chunk in chunks:
            tmp.write(chunk)
            size += len(chunk)
        tmp.seek(0)
        return create_file_from_stream(
            organization=organization, filename=filename, purpose=purpose, stream=tmp, size=size, expires_at=expires_at
        )


def create_uploaded_file(*, organization, upload, purpose=Purpose.BATCH, expires_after_s=None):
    """Keep a received upload (files.uploads) as a File; batch inputs expire after 30 days unless told."""
    now = timezone.now()
    if expires_after_s is None:
        expires_at = default_expiry(purpose, now)
    else:
        expires_at = now + timedelta(seconds=expires_after_s)
    try:
        return create_file_from_stream(
            organization=organization,
            filename=upload.name,
            purpose=purpose,
            stream=upload,
            size=upload.size,
            expires_at=expires_at,
            created_at=now,
        )
    finally:
        upload.close()  # deletes the temporary file unless storage moved it


def open_content(file):
    """Open the stored bytes for reading (binary)."""
    return default_storage.open(file.storage_name, "rb")


def open_records(file):
    """Open the stored bytes for reading records' lines by offset (ranged reads on object storage)."""
    return storage.open_records(default_storage, file.storage_name)


def pin(file):
    """Mark the file as read by an unfinished batch. False if the file is gone (deleted meanwhile)."""
    return File.objects.filter(pk=file.pk).update(pins=F("pins") + 1) == 1


def unpin(file_id):
    File.objects.filter(pk=file_id, pins__gt=0).update(pins=F("pins") - 1)


def delete_file(file):
    """Delete the row and its bytes (bytes after commit, so a rollback loses nothing)."""
    name = file.storage_name
    file.delete()
    transaction.on_commit(lambda: default_storage.delete(name))


def delete_unpinned_file(file):
    """The DELETE route: refuse while an unfinished batch reads the file.

    The row is locked while pins is checked, so a batch pinning the file at
    the same moment either comes first (409 here) or finds it gone.
    """
    with transaction.atomic():
        locked = File.objects.select_for_update().filter(pk=file.pk, pins=0).first()
        if locked is None:
            raise Conflict(
                f"File {file.public_id} is the input of a batch that has not finished, so it can't be "
                "deleted yet. Cancel the batch or wait for it to finish, then delete the file.",
                param="id",
                code="file_in_use",
            )
        delete_file(locked)


def delete_expired_files(now=None):
    """Delete every expired file that no unfinished batch reads: rows, then bytes. Returns the count.

    A pinned file outlives its expiry (a running batch's records point into
    it); the API already answers 404 for it, and a later sweep deletes it
    once its batch lets go.
    """
    now = now or timezone.now()
    count = 0
    while True:
        with transaction.atomic():
            doomed = list(
                File.objects.select_for_update()
                .filter(expires_at__lte=now, pins=0)
                .order_by("pk")
                .values_list("pk", "storage_name")[:EXPIRY_SWEEP_CHUNK]
            )
            File.objects.filter(pk__in=[pk for pk, _ in doomed]).delete()
            # After the commit: a rollback must never cost a file its bytes.
            names = [name for _, name in doomed]
            transaction.on_commit(lambda names=names: _delete_stored(names))
        count += len(doomed)
        if len(doomed) < EXPIRY_SWEEP_CHUNK:
            return count


def _delete_stored(names):
    for name in names:
        default_storage.delete(name)


def default_expiry(purpose, now=None):
    now = now or timezone.now()
    return now + (DEFAULT_BATCH_INPUT_TTL if purpose == "batch" else DEFAULT_OUTPUT_TTL)


# An upload's temp file lives only while its request runs; one older than this
# belongs to a web process that died mid-upload.
STALE_UPLOAD_AGE_S = 3600


def delete_stale_upload_temp_files(now=None):
    """Remove temp files left in FILE_UPLOAD_TEMP_DIR by web processes that died mid-upload."""
    cutoff = (now or time.time()) - STALE_UPLOAD_AGE_S
    removed = 0
    for path in Path(settings.FILE_UPLOAD_TEMP_DIR).glob("*"):
        try:
            if path.is_file() and path.stat().st_mtime < cutoff:
                os.unlink(path)
                removed += 1
        except FileNotFoundError:
            pass  # another web process finished or removed it meanwhile
    return removed
