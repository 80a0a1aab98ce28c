"""Admission from a real quote: once a batch has run on the model (its measured pace), a batch that
cannot finish in its window is created with a warning and batch.at_risk, or refused when strict; the
quote answers the same for every offered window, with its price."""

import pytest

from batches.engine.runner import run_batch
from batches.models import Batch
from openrelay.simulator.config import SimulatorConfig
from openrelay.simulator.server import run_in_thread
from tests.estimate_tests.conftest import line, ok, quote
from tests.helpers import CHAT, MODEL, deploy
from webhooks import services as webhooks
from webhooks.models import WebhookDelivery

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def paced(settings):
    """A model of ~80 calls/s (4 at once, 50 ms each) whose pace a finished batch of alice's measured."""
    settings.OPENRELAY_COMPLETION_WINDOWS = "5s:0.9,24h:0.5"
    with run_in_thread(SimulatorConfig(latency_ms=50)) as sim:
        yield sim


def _create(persona, records, window, **openrelay):
    body = {"endpoint": CHAT, "completion_window": window, "requests": [line(i) for i in range(records)]}
    return persona.client.post("/v1/batches", {**body, "openrelay": openrelay or None}, format="json")


def _measure(persona, sim):
    model = deploy(MODEL, sim.base_url, max_concurrency=4)
    warmup = _create(persona, 100, "24h")
    assert warmup.status_code == 200, warmup.content
    run_batch(Batch.objects.get(public_id=warmup.json()["id"]).pk)
    return model


def test_the_quote_answers_fits_window_for_every_offered_window_with_its_price(alice, paced):
    _measure(alice, paced)
    answer = ok(quote(alice, completion_window="5s", requests=[line(i) for i in range(2000)]))
    assert answer["time"]["basis"] == "recent_batches" and answer["fits_window"] is False
    by_window = {w["window"]: w for w in answer["windows"]}
    assert by_window["5s"]["fits_window"] is False and by_window["24h"]["fits_window"] is True
    assert (by_window["5s"]["rate"], by_window["24h"]["multiplier"]) == ("0.9", "0.5")
    assert answer["cost"]["expected"] == by_window["5s"]["cost"]["expected"]
    expedited = ok(quote(alice, completion_window="24h", priority="expedited", requests=[line(1)]))
    assert {w["multiplier"] for w in expedited["windows"]} == {"1.0"}


def test_a_batch_that_cannot_fit_is_warned_by_default_and_refused_when_strict(alice, paced):
    _measure(alice, paced)
    webhooks.create_endpoint(alice.org, name="risk", url="https://example.com/hook", event_types=["batch.at_risk"])
    before = Batch.objects.count()

    refused = _create(alice, 2000, "5s", admission="strict")
    assert refused.status_code == 400, refused.content
    error = refused.json()["error"]
    assert (error["code"], error["param"]) == ("window_cannot_be_met", "completion_window")
    assert Batch.objects.count() == before  # nothing was created

    warned = _create(alice, 2000, "5s")
    assert warned.status_code == 200, warned.content
    admission = warned.json()["openrelay"]["admission"]
    assert admission["fits_window"] is False and admission["basis"] == "recent_batches"
    assert admission["expected_duration_s"] > 5 and "5s window" in admission["warning"]
    batch = Batch.objects.get(public_id=warned.json()["id"])
    assert batch.at_risk_at is not None
    (event,) = WebhookDelivery.objects.filter(event_type="batch.at_risk")
    assert batch.public_id in event.payload and '"source":"admission"' in event.payload

    fits = _create(alice, 10, "5s", admission="strict")
    assert fits.status_code == 200, fits.content
    assert fits.json()["openrelay"]["admission"]["fits_window"] in (True, "at_risk")
    assert fits.json()["openrelay"]["admission"]["warning"] is None


def test_with_no_measured_pace_every_batch_is_admitted(alice, paced):
    deploy(MODEL, paced.base_url)
    created = _create(alice, 2000, "5s", admission="strict")
    assert created.status_code == 200, created.content
    assert created.json()["openrelay"]["admission"]["fits_window"] is None


def test_anthropic_batches_take_strict_admission_in_the_extension(alice, paced):
    _measure(alice, paced)
    body = {
        "requests": [
            {
                "custom_id": f"r{i}",
                "params": {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]},
            }
            for i in range(2000)
        ],
        "openrelay": {"completion_window": "5s", "admission": "strict"},
    }
    response = alice.client.post("/v1/messages/batches", body, format="json", HTTP_X_API_KEY=alice.key)
    assert response.status_code == 400 and "window_cannot_be_met" in response.content.decode()
