"""A running batch's expected completion in the API, and batch.at_risk once when it passes the window."""

from datetime import timedelta

import orjson
import pytest
from django.utils import timezone

from batches.models import Batch
from batches.risk import warn_at_risk
from tests.helpers import MODEL, chat, deploy, make_batch
from webhooks import services as webhooks
from webhooks.models import WebhookDelivery

pytestmark = pytest.mark.django_db(transaction=True)


def running(org, *, done, total, expires_in_s, rate=1.0):
    """A batch in progress whose last minute finished `rate` records a second."""
    now = timezone.now()
    batch = make_batch(org, [chat("x")])
    t = now.timestamp()
    Batch.objects.filter(pk=batch.pk).update(
        status="in_progress",
        in_progress_at=now - timedelta(seconds=120),
        total_count=total,
        completed_count=done,
        progress=[[round(t - 61, 1), done - int(61 * rate), 0], [round(t, 1), done, 0]],
        expires_at=now + timedelta(seconds=expires_in_s),
    )
    return Batch.objects.get(pk=batch.pk), now


def test_a_running_batch_shows_its_expected_completion(alice, fresh_sim, time_machine):
    # The clock stands still: a stalled batch's expected completion moves on with it (about 6 s a
    # second here), and two requests 4 s apart on a loaded machine once showed two (issue 55).
    # On a whole second: the progress samples keep 0.1 s and the answer whole seconds, and their
    # rounding at a fractional now once showed 1.08 s off (CI, SQLite pass).
    time_machine.move_to(timezone.now().replace(microsecond=0), tick=False)
    deploy(MODEL, fresh_sim.base_url)
    batch, now = running(alice.org, done=100, total=400, expires_in_s=3600)
    shown = alice.client.get(f"/v1/batches/{batch.public_id}").json()["openrelay"]["expected_completion_at"]
    assert shown == pytest.approx(now.timestamp() + 300, abs=1)  # 300 left at 1 a second

    listed = alice.client.get("/v1/batches").json()["data"][0]["openrelay"]
    assert listed["expected_completion_at"] == shown


def test_a_finished_or_waiting_batch_has_none(alice, fresh_sim):
    deploy(MODEL, fresh_sim.base_url)
    batch = make_batch(alice.org, [chat("x")])
    assert alice.client.get(f"/v1/batches/{batch.public_id}").json()["openrelay"]["expected_completion_at"] is None


def test_batch_at_risk_is_sent_once_with_its_figures(alice, bob, fresh_sim, time_machine):
    time_machine.move_to(timezone.now(), tick=False)  # the figures are read against now: it stands still
    deploy(MODEL, fresh_sim.base_url)
    webhooks.create_endpoint(alice.org, name="risk", url="https://example.com/hook", event_types=["batch.at_risk"])
    webhooks.create_endpoint(bob.org, name="risk", url="https://example.com/hook", event_types=["batch.at_risk"])
    late, now = running(alice.org, done=100, total=1000, expires_in_s=600)  # 900 s of work left, 600 s of window
    on_time, _ = running(alice.org, done=100, total=400, expires_in_s=600)

    assert warn_at_risk() == [late.pk]
    assert warn_at_risk() == []  # once

    [delivery] = WebhookDelivery.objects.all()
    event = orjson.loads(delivery.payload)
    assert event["type"] == "batch.at_risk" and event["data"]["id"] == late.public_id
    assert event["data"]["expected_completion_at"] > event["data"]["expires_at"]
    assert event["data"]["records_left_at_expiry"] == pytest.approx(300, abs=5), event
    assert delivery.endpoint.organization_id == alice.org.pk
    late.refresh_from_db()
    on_time.refresh_from_db()
    assert late.at_risk_at is not None and on_time.at_risk_at is None


def test_webhook_endpoints_can_subscribe_to_it(alice):
    response = alice.client.post(
        "/v1/webhook_endpoints",
        {"name": "risk", "url": "https://example.com/hook", "event_types": ["batch.at_risk"]},
        format="json",
    )
    assert response.status_code == 200, response.content
    assert "batch.at_risk" in alice.client.get("/v1/webhook_event_types").json()["data"]
