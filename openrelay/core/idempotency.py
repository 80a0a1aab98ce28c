"""`Idempotency-Key` on creates (POST /v1/batches, POST /v1/files): the same key and request give the
first answer's object again; the same key with another request is 409 `idempotency_key_reused`.

A key belongs to the caller's organization and one route, and is kept KEEP (24 h) after its first
use. The row is inserted before the create runs, so of two requests with one key at the same
moment the unique constraint lets exactly one create; the other gets the first's object once it
is there, or 409 `idempotency_key_in_use` (retryable) while it runs. A create that fails lets its
key go, so a retry of the same request runs again; a row left by a process killed mid-create is
taken over after STALE.
"""

import hashlib
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from openrelay.api.errors import ApiError, Conflict
from openrelay.core.models import IdempotencyKey

HEADER = "Idempotency-Key"
KEEP = timedelta(hours=24)
STALE = timedelta(minutes=10)
MAX_LENGTH = 255


def fingerprint(*parts):
    """The sha256 of a request's parts (bytes), each length-prefixed so no two requests share one."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(b"%d:" % len(part))
        digest.update(part)
    return digest.hexdigest()


def key_of(request):
    """The request's Idempotency-Key, or None; 400 for one that is empty or too long."""
    key = request.headers.get(HEADER)
    if key is None:
        return None
    if not 1 <= len(key) <= MAX_LENGTH:
        raise ApiError(
            f"The {HEADER} header must be 1 to {MAX_LENGTH} characters long.",
            param=HEADER,
            code="invalid_idempotency_key",
        )
    return key


def once(organization, route, key, print_, create, find):
    """`create()` once per key: a repeat returns `find(resource_id)` (the first answer's object).

    `create()` returns an object with a `public_id`; `find` loads one by it (None if it is gone)."""
    if key is None:
        return create()
    row = _claim(organization, route, key, print_)
    if isinstance(row, str):
        found = find(row)
        if found is None:
            raise Conflict(
                f"The {HEADER} was used for {row}, which no longer exists; send a new key.",
                param=HEADER,
                code="idempotency_key_reused",
            )
        return found
    try:
        made = create()
    except BaseException:
        row.delete()  # nothing was made: the same request may be retried with this key
        raise
    row.resource_id = made.public_id
    row.save(update_fields=["resource_id"])
    return made


def _claim(organization, route, key, print_):
    """This request's new row, or the resource id the key already made (raises 409 otherwise)."""
    now = timezone.now()
    # Expired keys go as the organization uses new ones: one indexed delete, no sweep needed.
    IdempotencyKey.objects.filter(organization=organization, created_at__lt=now - KEEP).delete()
    fields = dict(organization=organization, route=route, key=key)
    try:
        with transaction.atomic():
            return IdempotencyKey.objects.create(**fields, fingerprint=print_, created_at=now)
    except IntegrityError:
        pass
    existing = IdempotencyKey.objects.filter(**fields).first()
    if existing is not None and existing.fingerprint != print_:
        raise Conflict(
            f"This {HEADER} was already used with a different request in the last 24 hours; "
            "use a new key for a new request.",
            param=HEADER,
            code="idempotency_key_reused",
        )
    if existing is not None and existing.resource_id:
        return existing.resource_id
    # Still running (or let go by a failed first request just now: a retry finds the key free).
    if existing is not None and _take_over(existing, now):
        return existing
    raise Conflict(
        f"A request with this {HEADER} is still being processed; retry in a few seconds.",
        param=HEADER,
        code="idempotency_key_in_use",
        headers={"Retry-After": "1"},
    )


def _take_over(row, now):
    """A row left running by a process that died mid-create (older than STALE) becomes this request's."""
    taken = IdempotencyKey.objects.filter(pk=row.pk, resource_id="", created_at__lt=now - STALE).update(created_at=now)
    row.created_at = now
    return taken == 1
