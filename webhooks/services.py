"""Webhook endpoints and deliveries: every write that spans steps lives here.

Events are born in the transaction of the batch's terminal transition
(batches.lifecycle calls batch_finished), one delivery row per subscribed
endpoint, so an event exists exactly when the batch's status does. After
the commit the worker process's sender (webhooks.sender: bounded threads,
per organization too) sends each, so no close waits on a user's server; a
failed attempt waits for the retry sweep (tasks.deliver_due, every minute)
on a growing back-off.
"""

import asyncio
import logging
import math
import threading
import time
from collections import Counter
from contextlib import contextmanager
from datetime import timedelta

import orjson
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from openrelay.api.errors import ApiError
from openrelay.lib.outbound import OutboundClient, OutboundError
from openrelay.lib.redaction import redact
from webhooks import sender, signing
from webhooks.models import AT_RISK_EVENT, BATCH_EVENTS, DeliveryStatus, WebhookDelivery, WebhookEndpoint, new_event_id

logger = logging.getLogger("webhooks")

# Seconds to wait after attempt N fails (the retry sweep runs every minute):
# 9 attempts over ~2 days (OpenAI retries for up to 72 hours).
RETRY_AFTER_S = (60, 300, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 24 * 3600)
KEEP_OLD_SECRET = timedelta(hours=24)
USER_AGENT = "OpenRelay-Webhooks/1"
MAX_ERROR_CHARS = 300  # WebhookDelivery.last_error's length


# ---------------------------------------------------------------------------
# Endpoints


def create_endpoint(organization, *, name, url, event_types):
    """Create an endpoint; return it and its signing secret (shown this once)."""
    secret = signing.new_secret()
    endpoint = WebhookEndpoint.objects.create(
        organization=organization, name=name, url=url, event_types=event_types, signing_secret=secret
    )
    return endpoint, secret


def update_endpoint(endpoint, **changes):
    changed = {field: value for field, value in changes.items() if getattr(endpoint, field) != value}
    if changed:
        for field, value in changed.items():
            setattr(endpoint, field, value)
        endpoint.updated_at = timezone.now()
        endpoint.save(update_fields=[*changed, "updated_at"])
    return endpoint


def rotate_secret(endpoint, *, keep_old):
    """A new signing secret; the old one still signs for 24 hours if `keep_old`. Returns the new secret."""
    now = timezone.now()
    secret = signing.new_secret()
    endpoint.previous_secret = endpoint.signing_secret if keep_old else ""
    endpoint.previous_secret_until = now + KEEP_OLD_SECRET if keep_old else None
    endpoint.signing_secret = secret
    endpoint.updated_at = now
    endpoint.save(update_fields=["signing_secret", "previous_secret", "previous_secret_until", "updated_at"])
    return secret


def send_test(endpoint, event_type):
    """POST a sample event of `event_type` now; return the status code the endpoint answered.

    The caller waits for the endpoint (that is the point of a test), holding one of the web
    process's view slots (OPENRELAY_WEB_CONCURRENCY) meanwhile: 40 tests of an endpoint that
    never answers took every slot and held /healthz and every tenant's calls ~9 s. So tests in
    flight are bounded, per organization and per process, and one past a bound is a 429.
    """
    event_id = new_event_id()
    payload = _event_payload(event_id, event_type, int(time.time()), "batch_test")
    with _test_slot(endpoint.organization_id):
        try:
            return _post(endpoint, payload.decode(), event_id)
        except OutboundError as exc:
            message = redact(exc.message, _live_secrets(endpoint))
            raise ApiError(f"The test delivery failed: {message}", param=None, code="webhook_delivery_failed") from None


_tests_lock = threading.Lock()
_tests_in_flight = Counter()  # organization id -> its test deliveries in flight in this process


@contextmanager
def _test_slot(org_id):
    per_org = settings.OPENRELAY_WEBHOOK_TEST_CONCURRENCY
    in_process = max(1, settings.OPENRELAY_WEB_CONCURRENCY // 4)  # the other 3/4 of the slots stay free
    with _tests_lock:
        if _tests_in_flight[org_id] >= per_org or _tests_in_flight.total() >= in_process:
            raise ApiError(
                f"Too many test deliveries in flight (at most {per_org} per organization); "
                "try again when one has finished.",
                code="webhook_tests_busy",
                status=429,
                headers={"Retry-After": str(math.ceil(settings.OPENRELAY_WEBHOOK_TIMEOUT_S))},
            )
        _tests_in_flight[org_id] += 1
    try:
        yield
    finally:
        with _tests_lock:
            _tests_in_flight[org_id] -= 1
            if not _tests_in_flight[org_id]:
                del _tests_in_flight[org_id]


# ---------------------------------------------------------------------------
# Events


def batch_finished(batch, status, now):
    """Record the batch's terminal event for every endpoint that subscribes to it (in the caller's
    transaction), and send them once it commits."""
    event_type = BATCH_EVENTS.get(status)
    if event_type is not None:
        batch_event(batch, event_type, now)


def batch_at_risk(batch, figures, now):
    """Record `batch.at_risk` with its figures for every endpoint that subscribes (in the caller's
    transaction), and send them once it commits."""
    batch_event(batch, AT_RISK_EVENT, now, figures)


def batch_event(batch, event_type, now, figures=None):
    """Record `event_type` of the batch for every endpoint that subscribes to it (in the caller's
    transaction), and send them once it commits; OpenRelay's own events carry `figures`."""
    endpoints = [
        e for e in WebhookEndpoint.objects.filter(organization_id=batch.organization_id) if event_type in e.event_types
    ]
    if not endpoints:
        return
    event_id = new_event_id()
    payload = _event_payload(event_id, event_type, int(now.timestamp()), batch.public_id, figures).decode()
    # The task sent after the commit makes the first attempt; the retry sweep
    # only steps in if that task was lost (a broker hiccup, a crash).
    first_sweep = now + timedelta(seconds=RETRY_AFTER_S[0])
    deliveries = WebhookDelivery.objects.bulk_create(
        WebhookDelivery(
            endpoint=endpoint, event_id=event_id, event_type=event_type, payload=payload, next_attempt_at=first_sweep
        )
        for endpoint in endpoints
    )
    pks = [d.pk for d in deliveries]
    org_id = batch.organization_id
    transaction.on_commit(lambda: _send_after_commit(org_id, pks), robust=True)


def _event_payload(event_id, event_type, created_at, batch_id, figures=None):
    # OpenAI's event shape: {"id", "object": "event", "type", "created_at", "data": {"id"}}; OpenRelay's
    # own events carry their figures beside the id.
    data = {"id": batch_id, **(figures or {})}
    return orjson.dumps({"id": event_id, "object": "event", "type": event_type, "created_at": created_at, "data": data})


def _send_after_commit(org_id, pks):
    if settings.WORKER_PROCESS:
        # A worker just closed the batch (the engine's closer, or a sweep): the sender sends,
        # on threads of its own, so the closer goes on to the next batch at once.
        for pk in pks:
            submit(org_id, pk, first_only=True)
        return
    # A web process (a create whose every line was rejected) doesn't make its client wait.
    from django_q.tasks import async_task

    for pk in pks:
        async_task("webhooks.tasks.deliver", pk, group="webhooks")


# ---------------------------------------------------------------------------
# Delivery


def submit(org_id, pk, *, first_only):
    """Hand a delivery to this worker process's sender (webhooks.sender), which attempts it with
    deliver_pk on a thread of its own; False if this process holds it already."""
    return sender.sender(deliver_pk).submit(org_id, pk, first_only)


def deliver_pk(pk, *, first_only=True):
    """An attempt of a delivery by pk: its first (after the commit that made it) unless someone made
    it already, or (first_only=False) a due retry."""
    delivery = WebhookDelivery.objects.select_related("endpoint").filter(pk=pk).first()
    if delivery is None:
        return "gone"  # its endpoint was deleted
    # A retry may have waited in the sender's queue while another process sent it: only if still due.
    return deliver(delivery, first_only=first_only, due_only=not first_only)


def deliver(delivery, now=None, first_only=False, due_only=False):
    """One attempt: a 2xx delivers; anything else schedules the next attempt or, out of attempts, fails.

    The delivery is taken first (`sending_until`, conditional on nobody
    sending it now), so of senders racing (the finalizing worker, a task,
    overlapping retry sweeps) one sends. Returns the new status, or "taken".
    """
    now = now or timezone.now()
    lease = now + timedelta(seconds=2 * settings.OPENRELAY_WEBHOOK_TIMEOUT_S + 60)
    free = WebhookDelivery.objects.filter(
        Q(sending_until__isnull=True) | Q(sending_until__lt=now), pk=delivery.pk, status=DeliveryStatus.PENDING
    )
    if first_only:
        free = free.filter(attempts=0)
    if due_only:
        free = free.filter(next_attempt_at__lte=now)
    if not free.update(sending_until=lease):
        return "taken"
    delivery.refresh_from_db(fields=["attempts", "status"])  # as the one sender now holding it
    status_code, error = None, ""
    try:
        status_code = _post(delivery.endpoint, delivery.payload, delivery.event_id)
    except OutboundError as exc:
        # Names the origin and the failure, never a header; redacted all the same, like all peer text.
        error = redact(exc.message, _live_secrets(delivery.endpoint), MAX_ERROR_CHARS)
    done = timezone.now()
    delivery.attempts += 1
    if status_code is not None and 200 <= status_code < 300:
        delivery.status, delivery.delivered_at = DeliveryStatus.DELIVERED, done
    elif delivery.attempts > len(RETRY_AFTER_S):
        delivery.status = DeliveryStatus.FAILED
        logger.info(
            "webhook %s to %s failed after %d attempts",
            delivery.event_id,
            delivery.endpoint.public_id,
            delivery.attempts,
        )
    else:
        delivery.next_attempt_at = now + timedelta(seconds=RETRY_AFTER_S[delivery.attempts - 1])
    WebhookDelivery.objects.filter(pk=delivery.pk, sending_until=lease).update(
        status=delivery.status,
        attempts=delivery.attempts,
        last_status_code=status_code,
        last_error=error,
        next_attempt_at=delivery.next_attempt_at,
        delivered_at=delivery.delivered_at,
        sending_until=None,
    )
    return delivery.status


def _post(endpoint, body, event_id):
    """Sign and POST `body` (JSON text) to the endpoint; return the status code. Raises OutboundError."""
    data = body.encode()
    headers = {**signing.headers(_live_secrets(endpoint), event_id, int(time.time()), data), "User-Agent": USER_AGENT}

    async def send():
        async with OutboundClient() as client:
            response = await client.post_raw(
                endpoint.url, data, headers=headers, timeout_s=settings.OPENRELAY_WEBHOOK_TIMEOUT_S
            )
            return response.status

    return asyncio.run(send())


def _live_secrets(endpoint):
    secrets_in_use = [endpoint.signing_secret]
    if endpoint.previous_secret and endpoint.previous_secret_until and endpoint.previous_secret_until > timezone.now():
        secrets_in_use.append(endpoint.previous_secret)
    return secrets_in_use
