"""Pause, resume, spend caps and budgets through the API: the batch object, the codes, the events."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from batches.models import Batch, BatchStatus, Tally
from billing.models import LedgerEntry
from tests.batches_api_tests.helpers import chat_line, create, error_of, jsonl, upload
from webhooks.models import WebhookDelivery, WebhookEndpoint

pytestmark = pytest.mark.django_db


@pytest.fixture
def gemma(db):
    from tests.batches_api_tests.conftest import _catalog_model
    from tests.batches_api_tests.helpers import GEMMA

    return _catalog_model(GEMMA)


def _create(persona, **params):
    file = upload(persona, jsonl(chat_line("a"), chat_line("b")))
    return create(persona, input_file_id=file.public_id, **params)


def _running(persona, **params):
    response = _create(persona, **params)
    assert response.status_code == 200, response.content
    batch = Batch.objects.get(public_id=response.json()["id"])
    Batch.objects.filter(pk=batch.pk).update(status=BatchStatus.IN_PROGRESS, in_progress_at=timezone.now())
    return batch


def test_it_takes_a_cap_and_breaker_rules_at_create(alice, gemma):
    response = _create(alice, openrelay={"max_cost": "12.5", "breaker": {"window": 40, "failures": 10}})
    assert response.status_code == 200, response.content
    extension = response.json()["openrelay"]
    assert extension["max_cost"] == "12.500000000"
    assert extension["breaker"] == {"window": 40, "failures": 10, "consecutive": 50}
    assert extension["paused"] is None
    assert Batch.objects.get().max_cost_nanos == 12_500_000_000


def test_it_defaults_the_breaker_and_turns_it_off_on_request(alice, gemma):
    assert _create(alice).json()["openrelay"]["breaker"] == {"window": 100, "failures": 20, "consecutive": 50}
    assert _create(alice, openrelay={"breaker": False}).json()["openrelay"]["breaker"] == {
        "window": 0,
        "failures": 0,
        "consecutive": 0,
    }


@pytest.mark.parametrize(
    ("extension", "param", "code"),
    [
        ({"max_cost": 0}, "openrelay.max_cost", "invalid_value"),
        ({"max_cost": "1e-12"}, "openrelay.max_cost", "invalid_value"),
        ({"max_cost": "NaN"}, "openrelay.max_cost", "invalid_value"),
        ({"max_cost": "lots"}, "openrelay.max_cost", "invalid_type"),
        ({"max_cost": True}, "openrelay.max_cost", "invalid_type"),
        ({"max_cost": 1e12}, "openrelay.max_cost", "invalid_value"),
        ({"cap": 5}, "openrelay.cap", "unknown_parameter"),
        ({"breaker": {"window": -1}}, "openrelay.breaker.window", "invalid_value"),
        ({"breaker": "on"}, "openrelay.breaker", "invalid_type"),
        ("cheap", "openrelay", "invalid_type"),
    ],
)
def test_it_refuses_bad_guardrails_with_the_param(alice, gemma, extension, param, code):
    error = error_of(_create(alice, openrelay=extension))
    assert (error["param"], error["code"]) == (param, code)
    assert not Batch.objects.exists()


def test_pause_says_why_and_since_when_and_keeps_the_status(alice, gemma):
    batch = _running(alice)
    response = alice.client.post(f"/v1/batches/{batch.public_id}/pause")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "in_progress"
    paused = body["openrelay"]["paused"]
    assert paused["reason"] == "requested" and paused["message"] == "Paused by its owner."
    assert abs(paused["since"] - timezone.now().timestamp()) < 5
    # Again: a no-op, the first pause stands.
    again = alice.client.post(f"/v1/batches/{batch.public_id}/pause").json()
    assert again["openrelay"]["paused"] == paused
    assert alice.client.get(f"/v1/batches/{batch.public_id}").json()["openrelay"]["paused"] == paused


def test_resume_clears_the_pause_and_can_set_a_new_cap(alice, gemma):
    batch = _running(alice, openrelay={"max_cost": 1})
    alice.client.post(f"/v1/batches/{batch.public_id}/pause")
    response = alice.client.post(f"/v1/batches/{batch.public_id}/resume", {"max_cost": 3}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["openrelay"]["paused"] is None
    assert response.json()["openrelay"]["max_cost"] == "3.000000000"
    batch.refresh_from_db()
    assert batch.paused_at is None and batch.resumed_at is not None


def test_resume_refuses_a_cap_already_spent(alice, gemma):
    batch = _running(alice, openrelay={"max_cost": "0.001"})
    Batch.objects.filter(pk=batch.pk).update(output_tokens=1_000_000, price_output=Decimal("10"))
    alice.client.post(f"/v1/batches/{batch.public_id}/pause")
    error = error_of(alice.client.post(f"/v1/batches/{batch.public_id}/resume"), 409)
    assert (error["code"], error["param"]) == ("spend_cap_reached", "max_cost")
    ok = alice.client.post(f"/v1/batches/{batch.public_id}/resume", {"max_cost": 10}, format="json")
    assert ok.status_code == 200 and ok.json()["openrelay"]["paused"] is None


def test_pause_and_resume_refuse_a_finished_batch(alice, gemma):
    batch = _running(alice)
    Batch.objects.filter(pk=batch.pk).update(status=BatchStatus.COMPLETED)
    assert error_of(alice.client.post(f"/v1/batches/{batch.public_id}/pause"), 409)["code"] == "batch_not_pausable"
    assert error_of(alice.client.post(f"/v1/batches/{batch.public_id}/resume"), 409)["code"] == "batch_not_resumable"


def test_another_organizations_batch_is_not_found(alice, bob, gemma):
    batch = _running(alice)
    for action in ("pause", "resume"):
        assert error_of(bob.client.post(f"/v1/batches/{batch.public_id}/{action}"), 404)["code"] == "batch_not_found"
    assert Batch.objects.get(pk=batch.pk).paused_at is None


def test_resume_refuses_an_unknown_parameter(alice, gemma):
    batch = _running(alice)
    error = error_of(alice.client.post(f"/v1/batches/{batch.public_id}/resume", {"cap": 3}, format="json"))
    assert error["param"] == "cap"


def test_cancel_while_paused_cancels_and_ends_the_pause(alice, gemma):
    batch = _running(alice)
    alice.client.post(f"/v1/batches/{batch.public_id}/pause")
    body = alice.client.post(f"/v1/batches/{batch.public_id}/cancel").json()
    assert body["status"] == "cancelling" and body["openrelay"]["paused"] is None


def test_pause_and_resume_send_their_webhook_events_and_count(alice, gemma):
    hooked = WebhookEndpoint.objects.create(
        organization=alice.org,
        name="h",
        url="https://hooks.example.com/x",
        event_types=["batch.paused", "batch.resumed"],
    )
    WebhookEndpoint.objects.create(
        organization=alice.org, name="done only", url="https://hooks.example.com/y", event_types=["batch.completed"]
    )
    batch = _running(alice)
    alice.client.post(f"/v1/batches/{batch.public_id}/pause")
    alice.client.post(f"/v1/batches/{batch.public_id}/pause")  # no second event
    alice.client.post(f"/v1/batches/{batch.public_id}/resume")
    events = list(WebhookDelivery.objects.order_by("pk").values_list("endpoint_id", "event_type"))
    assert events == [(hooked.pk, "batch.paused"), (hooked.pk, "batch.resumed")]
    tallies = dict(Tally.objects.values_list("key", "value"))
    assert tallies["pauses|requested"] == 1 and tallies["resumes"] == 1


def test_a_spent_budget_refuses_creates_with_a_code(alice, gemma):
    alice.org.monthly_budget = Decimal("5.00")
    alice.org.save()
    assert _create(alice).status_code == 200
    LedgerEntry.objects.create(
        organization=alice.org,
        batch_id="batch_x",
        batch_status="completed",
        model_name="m",
        priority="standard",
        total_cost_nanos=5 * 10**9,
    )
    response = _create(alice)
    error = error_of(response, 402)
    assert error["code"] == "organization_budget_exceeded" and "5.00" in error["message"]
    assert response["x-should-retry"] == "false"


def test_last_months_spend_does_not_count(alice, gemma):
    alice.org.monthly_budget = Decimal("5.00")
    alice.org.save()
    LedgerEntry.objects.create(
        organization=alice.org,
        batch_id="batch_old",
        batch_status="completed",
        model_name="m",
        priority="standard",
        total_cost_nanos=50 * 10**9,
        created_at=timezone.now().replace(day=1) - timedelta(days=1),
    )
    assert _create(alice).status_code == 200


def test_limits_show_spend_against_the_budget(alice, gemma):
    assert alice.client.get("/v1/limits").json()["organization"]["budget"] is None
    alice.org.monthly_budget = Decimal("10")
    alice.org.save()
    batch = _running(alice)  # running: its live cost counts
    Batch.objects.filter(pk=batch.pk).update(output_tokens=1_000_000, price_output=Decimal("4"), price_multiplier=1)
    budget = alice.client.get("/v1/limits").json()["organization"]["budget"]
    assert budget == {
        "currency": "USD",
        "period": "month",
        "budget": "10.000000000",
        "spent": "4.000000000",
        "remaining": "6.000000000",
        "exhausted": False,
    }


def test_resume_refuses_while_the_budget_is_spent(alice, gemma):
    batch = _running(alice)
    alice.client.post(f"/v1/batches/{batch.public_id}/pause")
    alice.org.monthly_budget = Decimal("1")
    alice.org.save()
    Batch.objects.filter(pk=batch.pk).update(output_tokens=1_000_000, price_output=Decimal("4"))
    assert error_of(alice.client.post(f"/v1/batches/{batch.public_id}/resume"), 402)["code"] == (
        "organization_budget_exceeded"
    )
    assert Batch.objects.get(pk=batch.pk).paused_at is not None


def test_metrics_count_pauses_by_reason_and_show_the_paused_batches(alice, gemma):
    from batches.metrics import scrape

    batch = _running(alice)
    alice.client.post(f"/v1/batches/{batch.public_id}/pause")
    text = scrape().decode()
    assert 'openrelay_batch_pauses_total{reason="requested"} 1.0' in text
    assert 'openrelay_batches_paused{reason="requested"} 1.0' in text
    assert 'openrelay_batches_paused{reason="spend_cap"} 0.0' in text
    alice.client.post(f"/v1/batches/{batch.public_id}/resume")
    text = scrape().decode()
    assert "openrelay_batch_resumes_total 1.0" in text
    assert 'openrelay_batches_paused{reason="requested"} 0.0' in text


def test_the_admin_shows_spend_against_the_budget(client, admin_user, alice, gemma):
    alice.org.monthly_budget = Decimal("5")
    alice.org.save()
    LedgerEntry.objects.create(
        organization=alice.org,
        batch_id="batch_y",
        batch_status="completed",
        model_name="m",
        priority="standard",
        total_cost_nanos=2 * 10**9,
    )
    client.force_login(admin_user)
    page = client.get("/admin/openrelay/organization/").content.decode()
    assert "2.000000000 of 5.000000000 (40%)" in page
    form = client.get(f"/admin/openrelay/organization/{alice.org.pk}/change/").content.decode()
    assert 'name="monthly_budget"' in form and "2.000000000 of 5.000000000" in form
