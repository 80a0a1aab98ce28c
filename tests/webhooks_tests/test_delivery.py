"""Batch events: born with the terminal transition, signed as the OpenAI SDK checks, retried on a back-off."""

import logging
import time
from datetime import timedelta

import orjson
import pytest
from django.db import transaction
from django.utils import timezone

from batches import lifecycle
from batches.engine import finish
from batches.engine.runner import run_batch
from batches.models import Batch, BatchStatus
from openrelay.core.models import Deployment, Model
from tests.helpers import MODEL, chat, make_batch, make_persona
from webhooks import services, tasks
from webhooks.models import DeliveryStatus, WebhookDelivery


def _endpoint(org, url, *event_types):
    return services.create_endpoint(org, name="hooks", url=url, event_types=list(event_types))


def test_a_completed_batch_is_delivered_to_its_subscribers_only(alice, model, receiver, verifier):
    hooked, secret = _endpoint(alice.org, receiver.url, "batch.completed", "batch.cancelled")
    _endpoint(alice.org, receiver.url, "batch.failed")  # not subscribed to completed
    bob = make_persona("bob-org")
    _endpoint(bob.org, receiver.url, "batch.completed")  # another organization's
    batch = make_batch(alice.org, [chat("a"), chat("b")])

    run_batch(batch.pk)

    batch.refresh_from_db()
    assert batch.status == BatchStatus.COMPLETED
    [delivery] = WebhookDelivery.objects.all()
    assert delivery.endpoint == hooked and delivery.status == DeliveryStatus.PENDING
    assert tasks.deliver(delivery.pk) == DeliveryStatus.DELIVERED
    [received] = receiver.received
    event = verifier.unwrap(received.body, received.headers, secret=secret)
    assert (event.type, event.object, event.data.id) == ("batch.completed", "event", batch.public_id)
    assert event.created_at == int(batch.completed_at.timestamp()) and event.id == delivery.event_id
    assert received.body == delivery.payload.encode()
    assert received.headers["content-type"] == "application/json"
    delivery.refresh_from_db()
    assert (delivery.attempts, delivery.last_status_code, delivery.delivered_at is not None) == (1, 200, True)
    assert tasks.deliver(delivery.pk) == "taken" and len(receiver.received) == 1  # once


def test_failed_attempts_back_off_and_keep_the_event_id(alice, receiver, verifier, db):
    _, secret = _endpoint(alice.org, receiver.url, "batch.cancelled")
    batch = make_persona_batch(alice)
    lifecycle.transition(batch, BatchStatus.CANCELLING)
    finish.complete_cancellation(batch)
    [delivery] = WebhookDelivery.objects.all()
    receiver.statuses = [500, 503]
    started = timezone.now()

    assert tasks.deliver(delivery.pk) == DeliveryStatus.PENDING
    delivery.refresh_from_db()
    assert (delivery.attempts, delivery.last_status_code) == (1, 500)
    assert timedelta(seconds=59) < delivery.next_attempt_at - started < timedelta(seconds=70)
    assert tasks.deliver_due(now=started + timedelta(seconds=30)) == 0  # not due yet
    assert tasks.deliver_due(now=started + timedelta(seconds=61)) == 1
    delivery.refresh_from_db()
    assert (delivery.attempts, delivery.last_status_code, delivery.status) == (2, 503, DeliveryStatus.PENDING)
    assert tasks.deliver_due(now=started + timedelta(seconds=61 + 301)) == 1
    delivery.refresh_from_db()
    assert (delivery.attempts, delivery.status) == (3, DeliveryStatus.DELIVERED)

    assert len({r.headers["webhook-id"] for r in receiver.received}) == 1
    for received in receiver.received:
        assert verifier.unwrap(received.body, received.headers, secret=secret).type == "batch.cancelled"


def test_a_delivery_out_of_attempts_fails(alice, receiver, db):
    _endpoint(alice.org, receiver.url, "batch.cancelled")
    batch = make_persona_batch(alice)
    lifecycle.transition(batch, BatchStatus.CANCELLING)
    finish.complete_cancellation(batch)
    delivery = WebhookDelivery.objects.get()
    WebhookDelivery.objects.filter(pk=delivery.pk).update(attempts=len(services.RETRY_AFTER_S))
    receiver.statuses = [500]
    assert services.deliver(delivery) == DeliveryStatus.FAILED  # the last retry
    assert tasks.deliver_due(now=timezone.now() + timedelta(days=30)) == 0  # never again


def test_an_unreachable_endpoint_is_retried_and_its_secret_stays_out_of_logs(alice, settings, db, caplog):
    settings.OPENRELAY_ALLOW_PRIVATE_URLS = True
    _, secret = _endpoint(alice.org, "http://127.0.0.1:9/hooks", "batch.cancelled")
    batch = make_persona_batch(alice)
    lifecycle.transition(batch, BatchStatus.CANCELLING)
    caplog.set_level(logging.DEBUG)
    finish.complete_cancellation(batch)
    delivery = WebhookDelivery.objects.get()
    WebhookDelivery.objects.filter(pk=delivery.pk).update(attempts=len(services.RETRY_AFTER_S))

    assert services.deliver(delivery) == DeliveryStatus.FAILED  # the last retry
    delivery.refresh_from_db()
    assert delivery.last_status_code is None and "could not connect" in delivery.last_error
    assert secret not in caplog.text and secret[6:] not in caplog.text


def test_the_guard_applies_at_delivery_time_too(alice, receiver, settings, db):
    _endpoint(alice.org, receiver.url, "batch.cancelled")
    settings.OPENRELAY_ALLOW_PRIVATE_URLS = False  # turned off after the endpoint was saved
    batch = make_persona_batch(alice)
    lifecycle.transition(batch, BatchStatus.CANCELLING)
    finish.complete_cancellation(batch)
    delivery = WebhookDelivery.objects.get()
    assert tasks.deliver(delivery.pk) == DeliveryStatus.PENDING
    delivery.refresh_from_db()
    assert receiver.received == [] and delivery.last_status_code is None
    assert "127.0.0.1" in delivery.last_error and "private" in delivery.last_error


@pytest.mark.parametrize("ending, event_type", [("expired", "batch.expired"), ("failed", "batch.failed")])
def test_every_terminal_status_has_its_event(alice, receiver, db, ending, event_type):
    _endpoint(alice.org, receiver.url, "batch.completed", "batch.failed", "batch.expired", "batch.cancelled")
    if ending == "failed":
        # Every line rejected at create: the batch is born failed.
        response = alice.client.post(
            "/v1/batches",
            {
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
                "requests": [{"custom_id": "x", "method": "POST"}],
            },
            format="json",
        )
        assert response.json()["status"] == "failed"
        public_id = response.json()["id"]
    else:
        batch = make_persona_batch(alice)
        lifecycle.transition(batch, BatchStatus.IN_PROGRESS)
        Batch.objects.filter(pk=batch.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
        batch.refresh_from_db()
        assert finish.expire_if_due(batch)
        public_id = batch.public_id
    [delivery] = WebhookDelivery.objects.all()
    payload = orjson.loads(delivery.payload)
    assert (payload["type"], payload["data"]) == (event_type, {"id": public_id})


def test_no_event_without_the_transition(alice, receiver, db):
    _endpoint(alice.org, receiver.url, "batch.cancelled")
    batch = make_persona_batch(alice)
    lifecycle.transition(batch, BatchStatus.CANCELLING)
    with pytest.raises(RuntimeError), transaction.atomic():
        lifecycle.transition(batch, BatchStatus.CANCELLED)
        raise RuntimeError("the close failed after the transition")
    assert not WebhookDelivery.objects.exists()
    assert Batch.objects.get(pk=batch.pk).status == BatchStatus.CANCELLING


def test_deleting_an_endpoint_drops_its_pending_deliveries(alice, receiver, db):
    endpoint, _ = _endpoint(alice.org, receiver.url, "batch.cancelled")
    batch = make_persona_batch(alice)
    lifecycle.transition(batch, BatchStatus.CANCELLING)
    finish.complete_cancellation(batch)
    pk = WebhookDelivery.objects.get().pk
    response = alice.client.delete(f"/v1/webhook_endpoints/{endpoint.public_id}")
    assert response.status_code == 200
    assert tasks.deliver(pk) == "gone" and receiver.received == []


def test_the_admin_never_shows_the_secret(alice, receiver, admin_user, client, db):
    endpoint, secret = _endpoint(alice.org, receiver.url, "batch.completed")
    client.force_login(admin_user)
    for url in ("/admin/webhooks/webhookendpoint/", f"/admin/webhooks/webhookendpoint/{endpoint.pk}/change/"):
        page = client.get(url)
        assert page.status_code == 200 and secret not in page.content.decode()
    assert client.get("/admin/webhooks/webhookendpoint/add/").status_code == 403


def make_persona_batch(persona):
    """A small created batch (through the API), still validating."""
    model, _ = Model.objects.get_or_create(name=MODEL)
    Deployment.objects.get_or_create(model=model, base_url="http://127.0.0.1:9/v1")
    response = persona.client.post(
        "/v1/batches",
        {
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
            "requests": [
                {
                    "custom_id": "a",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
                }
            ],
        },
        format="json",
    )
    assert response.status_code == 200, response.content
    return Batch.objects.get(public_id=response.json()["id"])


@pytest.mark.slow
def test_a_real_cluster_runs_the_batch_and_delivers_its_event(alice, model, receiver, verifier, clusters):
    _, secret = _endpoint(alice.org, receiver.url, "batch.completed")
    batch = make_batch(alice.org, [chat(f"q{i}") for i in range(20)])
    clusters()  # its engines find the batch by themselves
    deadline = time.monotonic() + 60
    while not receiver.received:
        assert time.monotonic() < deadline, "no webhook arrived"
        time.sleep(0.05)
    event = verifier.unwrap(receiver.received[0].body, receiver.received[0].headers, secret=secret)
    assert (event.type, event.data.id) == ("batch.completed", batch.public_id)
    assert Batch.objects.get(pk=batch.pk).status == BatchStatus.COMPLETED
    deadline = time.monotonic() + 10
    while WebhookDelivery.objects.get().status != DeliveryStatus.DELIVERED:  # the worker records it after the 200
        assert time.monotonic() < deadline, "the delivery was not recorded"
        time.sleep(0.05)


def test_a_sweep_skips_a_delivery_another_sweep_took(alice, receiver, db):
    _endpoint(alice.org, receiver.url, "batch.cancelled")
    batch = make_persona_batch(alice)
    lifecycle.transition(batch, BatchStatus.CANCELLING)
    finish.complete_cancellation(batch)
    later = timezone.now() + timedelta(minutes=2)
    stale = list(WebhookDelivery.objects.select_related("endpoint").filter(next_attempt_at__lte=later))
    assert tasks.deliver_due(now=later) == 1  # this sweep took it and sent it
    # Another sweep that read the same row before: its conditional take (the one
    # deliver_due makes) changes nothing, so nothing is sent twice.
    assert (
        WebhookDelivery.objects.filter(
            pk=stale[0].pk, status=DeliveryStatus.PENDING, next_attempt_at=stale[0].next_attempt_at
        ).update(next_attempt_at=later)
        == 0
    )
    assert tasks.deliver_due(now=later) == 0 and len(receiver.received) == 1


def test_a_delivery_being_sent_is_not_due_for_another_sweep(alice, receiver, db, monkeypatch):
    _endpoint(alice.org, receiver.url, "batch.cancelled")
    batch = make_persona_batch(alice)
    lifecycle.transition(batch, BatchStatus.CANCELLING)
    finish.complete_cancellation(batch)
    later = timezone.now() + timedelta(minutes=2)
    receiver.statuses = [500]
    during = []
    real_post = services._post

    def post_while_another_sweep_runs(endpoint, body, event_id):
        during.append(tasks.deliver_due(now=later))  # a second sweep starts mid-send
        during.append(tasks.deliver(WebhookDelivery.objects.get().pk))  # and a task for the same delivery
        return real_post(endpoint, body, event_id)

    monkeypatch.setattr(services, "_post", post_while_another_sweep_runs)
    assert tasks.deliver_due(now=later) == 1
    assert during == [0, "taken"] and len(receiver.received) == 1
    delivery = WebhookDelivery.objects.get()
    assert (delivery.attempts, delivery.last_status_code) == (1, 500)
