"""One organization's endpoints that never answer hold neither another's batch close nor its events
(issue 42, finding 2: B's batch had every record done at 0.8 s and stayed in_progress 158 s)."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from batches.models import BatchStatus
from tests.helpers import chat, make_batch, make_persona, status_of, wait_for
from webhooks import services, tasks
from webhooks.models import DeliveryStatus, WebhookDelivery

HANG_S = 60  # each attempt on A's endpoints waits this long (OPENRELAY_WEBHOOK_TIMEOUT_S) before giving up
ORG_CONCURRENCY = 2


@pytest.mark.slow
def test_hanging_endpoints_of_one_org_hold_neither_another_orgs_close_nor_its_event(
    model, hanging, receiver, verifier, clusters
):
    alice, bob = make_persona("alice-org"), make_persona("bob-org")
    for i in range(20):
        services.create_endpoint(alice.org, name=f"dead {i}", url=hanging.url, event_types=["batch.completed"])
    _, secret = services.create_endpoint(bob.org, name="live", url=receiver.url, event_types=["batch.completed"])
    alices = [make_batch(alice.org, [chat(f"a{i}")]) for i in range(4)]
    clusters(OPENRELAY_WEBHOOK_TIMEOUT_S=HANG_S, OPENRELAY_WEBHOOK_ORG_CONCURRENCY=ORG_CONCURRENCY)
    # Alice's batches close first, so their deliveries are hanging when Bob's batch comes to close.
    wait_for(lambda: any(status_of(b) == BatchStatus.COMPLETED for b in alices), 60, "one of alice's batches to close")
    wait_for(lambda: hanging.open >= 1, 30, "alice's deliveries to reach the endpoint that hangs")

    bobs = make_batch(bob.org, [chat(f"b{i}") for i in range(3)])
    started = time.monotonic()
    closed_in = wait_for(lambda: status_of(bobs) == BatchStatus.COMPLETED, HANG_S, "bob's batch to close")
    wait_for(lambda: receiver.received, HANG_S - (time.monotonic() - started), "bob's event")
    delivered_in = time.monotonic() - started

    # Well before one hanging attempt could have ended (inline sends held the closer 20 x 60 s a batch).
    assert closed_in < HANG_S / 3, closed_in
    assert delivered_in < HANG_S / 3, delivered_in
    event = verifier.unwrap(receiver.received[0].body, receiver.received[0].headers, secret=secret)
    assert event.data.id == bobs.public_id
    wait_for(lambda: all(status_of(b) == BatchStatus.COMPLETED for b in alices), 30, "alice's other batches to close")
    # Alice's 80 deliveries took at most her share of each worker's sender (2 workers), never more.
    assert 1 <= hanging.most_open <= 2 * ORG_CONCURRENCY, hanging.most_open
    assert WebhookDelivery.objects.filter(endpoint__organization=alice.org).count() == 80
    assert not WebhookDelivery.objects.filter(endpoint__organization=alice.org, status=DeliveryStatus.DELIVERED)


def test_a_sweep_takes_at_most_its_share_of_one_orgs_due_deliveries(db):
    alice, bob = make_persona("alice-org"), make_persona("bob-org")
    dead, _ = services.create_endpoint(alice.org, name="dead", url="https://a.example/", event_types=["batch.failed"])
    live, _ = services.create_endpoint(bob.org, name="live", url="https://b.example/", event_types=["batch.failed"])
    now = timezone.now()
    WebhookDelivery.objects.bulk_create(
        WebhookDelivery(
            endpoint=dead, event_type="batch.failed", payload="{}", next_attempt_at=now - timedelta(hours=1)
        )
        for _ in range(tasks.DUE_PER_SWEEP + 5)
    )
    bobs = WebhookDelivery.objects.create(endpoint=live, event_type="batch.failed", payload="{}", next_attempt_at=now)

    due = list(tasks._due(now)[: tasks.DUE_PER_SWEEP])

    # Bob's one delivery is the newest due of all, yet in the sweep: Alice's 205 older ones take only her share.
    assert bobs in due
    assert sum(d.endpoint_id == dead.pk for d in due) == tasks.DUE_PER_ORG
