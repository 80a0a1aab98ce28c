"""Writes that involve File rows and their stored bytes.

Bytes live in Django's default storage (a folder under OPENRELAY_DATA_DIR by
default); a File row exists only once its bytes are fully stored.
"""

from datetime import timedelta

from django.core.files.base import File as DjangoFile
from django.core.files.storage import default_storage
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from files.models import File

DEFAULT_BATCH_INPUT_TTL = timedelta(days=30)
DEFAULT_OUTPUT_TTL = timedelta(days=30)


def _storage_name(organization, public_id):
    return f"org-{organization.pk}/{public_id}.jsonl"


def create_file_from_stream(*, organization, filename, purpose, stream, size, expires_at=None):
    """Store a binary stream (a Django UploadedFile, a temp file) and create its row."""
    file = File(organization=organization, filename=filename, purpose=purpose, bytes=size, expires_at=expires_at)
    file.storage_name = default_storage.save(_storage_name(organization, file.public_id), DjangoFile(stream))
    try:
        file.save()
    except Exception:
        default_storage.delete(file.storage_name)
        raise
    return file


def create_file_from_chunks(*, organization, filename, purpose, chunks, expires_at=None):
    """Store an iterable of bytes chunks as a new File (inline requests, result files)."""
    import tempfile

    with tempfile.TemporaryFile() as tmp:
        size = 0
        for chunk in chunks:
            tmp.write(chunk)
            size += len(chunk)
        tmp.seek(0)
        return create_file_from_stream(
            organization=organization, filename=filename, purpose=purpose, stream=tmp, size=size, expires_at=expires_at
        )


def open_content(file):
    """Open the stored bytes for reading (binary)."""
    return default_storage.open(file.storage_name, "rb")


def pin(file):
    File.objects.filter(pk=file.pk).update(pins=F("pins") + 1)


def unpin(file_id):
    File.objects.filter(pk=file_id, pins__gt=0).update(pins=F("pins") - 1)


def delete_file(file):
    """Delete the row and its bytes (bytes after commit, so a rollback loses nothing)."""
    name = file.storage_name
    file.delete()
    transaction.on_commit(lambda: default_storage.delete(name))


def default_expiry(purpose, now=None):
    now = now or timezone.now()
    return now + (DEFAULT_BATCH_INPUT_TTL if purpose == "batch" else DEFAULT_OUTPUT_TTL)
