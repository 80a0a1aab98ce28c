"""GET /v1/organization/usage: the caller's billed totals by day and model, on the control host."""

from datetime import date, timedelta

import pytest
from django.utils import timezone

from batches.engine.runner import run_batch
from billing.models import LedgerEntry
from tests.billing_tests.conftest import LONG, OTHER_MODEL, as_usd, create, entry, oracle_cost
from tests.helpers import MODEL, chat

URL = "/v1/organization/usage"
# Entries of batches whose every answer was billed (test_every_call_counts.py has unbilled ones).
NO_UNBILLED = {
    "input_tokens": 0,
    "cached_tokens": 0,
    "output_tokens": 0,
    "total_tokens": 0,
    "cost": {"currency": "USD", "total": "0.000000000"},
}


def cost_object(*tokens):
    parts = [0, 0, 0, 0]
    for usage in tokens:
        parts = [a + b for a, b in zip(parts, oracle_cost(*usage))]
    return {
        "currency": "USD",
        "input": as_usd(parts[0]),
        "cached_input": as_usd(parts[1]),
        "output": as_usd(parts[2]),
        "total": as_usd(parts[3]),
    }


@pytest.mark.django_db
class TestTotals:
    def test_it_sums_the_callers_entries_by_day_and_model(self, alice, bob):
        day1, day2 = date(2026, 11, 30), date(2026, 12, 1)
        entry(alice.org, day1, hour=0)
        entry(alice.org, day1, tokens=(10, 0, 5), hour=23)
        entry(alice.org, day1, model=OTHER_MODEL, tokens=(7, 0, 7))
        entry(alice.org, day2, tokens=(1, 0, 1))
        entry(alice.org, date(2026, 12, 2))  # after the range
        entry(bob.org, day1, tokens=(999, 0, 999))

        response = alice.client.get(URL, {"start": "2026-11-30", "end": "2026-12-01"})

        assert response.status_code == 200
        body = response.json()
        assert (body["object"], body["start"], body["end"]) == ("organization.usage", "2026-11-30", "2026-12-01")
        assert body["data"] == [
            {
                "date": "2026-11-30",
                "model": MODEL,
                "batches": 2,
                "input_tokens": 1010,
                "cached_tokens": 256,
                "output_tokens": 305,
                "total_tokens": 1315,
                "cost": cost_object((1000, 256, 300), (10, 0, 5)),
                "unbilled": NO_UNBILLED,
            },
            {
                "date": "2026-11-30",
                "model": OTHER_MODEL,
                "batches": 1,
                "input_tokens": 7,
                "cached_tokens": 0,
                "output_tokens": 7,
                "total_tokens": 14,
                "cost": cost_object((7, 0, 7)),
                "unbilled": NO_UNBILLED,
            },
            {
                "date": "2026-12-01",
                "model": MODEL,
                "batches": 1,
                "input_tokens": 1,
                "cached_tokens": 0,
                "output_tokens": 1,
                "total_tokens": 2,
                "cost": cost_object((1, 0, 1)),
                "unbilled": NO_UNBILLED,
            },
        ]
        assert body["total"] == {
            "batches": 4,
            "input_tokens": 1018,
            "cached_tokens": 256,
            "output_tokens": 313,
            "total_tokens": 1331,
            "cost": cost_object((1000, 256, 300), (10, 0, 5), (7, 0, 7), (1, 0, 1)),
            "unbilled": NO_UNBILLED,
        }

    def test_bob_never_sees_alices_usage(self, alice, bob):
        entry(alice.org, timezone.now().date())
        body = bob.client.get(URL).json()
        assert body["data"] == []
        assert body["total"]["batches"] == 0 and body["total"]["cost"]["total"] == "0.000000000"
        assert len(alice.client.get(URL).json()["data"]) == 1

    def test_it_defaults_to_the_30_days_ending_today(self, alice):
        today = timezone.now().date()
        entry(alice.org, today)
        entry(alice.org, today - timedelta(days=29))
        entry(alice.org, today - timedelta(days=30))
        body = alice.client.get(URL).json()
        assert (body["start"], body["end"]) == ((today - timedelta(days=29)).isoformat(), today.isoformat())
        assert [row["date"] for row in body["data"]] == [(today - timedelta(days=29)).isoformat(), today.isoformat()]

    @pytest.mark.parametrize(
        "params, param, fragment",
        [
            ({"start": "2026-13-01"}, "start", "expected a date as YYYY-MM-DD"),
            ({"end": "20261201"}, "end", "expected a date as YYYY-MM-DD"),
            ({"start": "yesterday"}, "start", "'yesterday'"),
            ({"start": "2026-12-02", "end": "2026-12-01"}, "start", "is after 'end'"),
            ({"start": "2025-01-01", "end": "2026-01-02"}, "start", "at most 366"),
        ],
    )
    def test_it_answers_bad_params_in_the_error_envelope(self, alice, params, param, fragment):
        response = alice.client.get(URL, params)
        assert response.status_code == 400
        error = response.json()["error"]
        assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, "invalid_value")
        assert fragment in error["message"]

    @pytest.mark.parametrize(
        "params, start, end",
        [
            ({"end": "0001-01-05"}, "0001-01-01", "0001-01-05"),
            ({"start": "9999-12-01", "end": "9999-12-31"}, "9999-12-01", "9999-12-31"),
        ],
    )
    def test_it_takes_the_first_and_last_days_of_the_calendar(self, alice, params, start, end):
        response = alice.client.get(URL, params)
        assert response.status_code == 200
        assert (response.json()["start"], response.json()["end"], response.json()["data"]) == (start, end, [])

    def test_it_needs_an_api_key(self, client):
        response = client.get(URL)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "missing_api_key"

    def test_it_costs_one_query_however_many_entries(self, alice, django_assert_num_queries):
        for offset in range(20):
            entry(alice.org, date(2026, 12, 1) - timedelta(days=offset % 5), batch_id=f"batch_{offset}", hour=offset)
        alice.client.get(URL)  # the key is read once per 5 s, its last_used_at written once a minute
        with django_assert_num_queries(1):  # the totals
            response = alice.client.get(URL, {"start": "2026-11-01", "end": "2026-12-01"})
        assert sum(row["batches"] for row in response.json()["data"]) == 20


@pytest.mark.django_db
class TestHosts:
    def test_it_is_served_on_the_control_host_and_refused_on_the_inference_host(self, alice, settings):
        settings.OPENRELAY_INFERENCE_HOSTS = ["inference.openrelay.inc"]
        settings.OPENRELAY_CONTROL_HOSTS = ["api.openrelay.inc"]
        assert alice.client.get(URL, HTTP_HOST="api.openrelay.inc").status_code == 200
        assert alice.client.get(URL, HTTP_HOST="api.openrelay.inc:443").status_code == 200
        refused = alice.client.get(URL, HTTP_HOST="inference.openrelay.inc")
        assert refused.status_code == 404
        assert (refused.json()["error"]["type"], refused.json()["error"]["code"]) == ("not_found_error", "unknown_url")
        # and the batch routes stay where they were
        assert alice.client.get("/v1/batches", HTTP_HOST="api.openrelay.inc").status_code == 404
        assert alice.client.get("/v1/batches", HTTP_HOST="inference.openrelay.inc").status_code == 200

    def test_with_only_one_host_list_set_the_other_host_is_refused(self, alice, settings):
        settings.OPENRELAY_INFERENCE_HOSTS = ["inference.openrelay.inc"]
        assert alice.client.get(URL, HTTP_HOST="api.openrelay.inc").status_code == 200
        assert alice.client.get(URL, HTTP_HOST="inference.openrelay.inc").status_code == 404
        settings.OPENRELAY_INFERENCE_HOSTS = []
        settings.OPENRELAY_CONTROL_HOSTS = ["api.openrelay.inc"]
        assert alice.client.get(URL, HTTP_HOST="api.openrelay.inc").status_code == 200
        assert alice.client.get(URL, HTTP_HOST="other.local").status_code == 404

    def test_one_host_serves_it_when_no_hosts_are_configured(self, alice):
        assert alice.client.get(URL, HTTP_HOST="anything.local").status_code == 200

    def test_a_path_that_only_starts_like_the_route_is_not_a_control_route(self, alice, settings):
        settings.OPENRELAY_CONTROL_HOSTS = ["api.openrelay.inc"]
        # Not ours, so the host rule does not apply: Django's own 404 answers on any host.
        response = alice.client.get("/v1/organizations", HTTP_HOST="other.local")
        assert response.status_code == 404 and response.json()["error"]["code"] == "unknown_url"


def test_a_finished_batch_shows_up_today(alice, model, sim):
    batch = create(alice, [chat("one"), chat(LONG)])
    run_batch(batch.pk)
    entry_row = LedgerEntry.objects.get(batch_id=batch.public_id)
    [row] = alice.client.get(URL).json()["data"]
    assert row["date"] == timezone.now().date().isoformat() and row["model"] == MODEL and row["batches"] == 1
    assert row["cost"]["total"] == as_usd(entry_row.total_cost_nanos)
    assert row["input_tokens"] == entry_row.input_tokens > 0
