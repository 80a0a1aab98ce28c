"""Where reuse shows: the batch object's `openrelay.reuse`, GET /metrics, the dashboard's batch
page, and the quote (it quotes the calls, not the twins)."""

import re

from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from batches.engine.runner import run_batch
from batches.models import Batch
from openrelay.core.models import Membership
from tests.helpers import CHAT, MODEL, chat
from tests.reuse_tests.conftest import create, upload

TOKEN = "metrics-token-reuse"


def run(persona, bodies, **openrelay):
    answer = create(persona, bodies, **openrelay)
    batch = Batch.objects.get(public_id=answer["id"])
    run_batch(batch.pk)
    batch.refresh_from_db()
    assert batch.status == "completed"
    return batch


def test_the_batch_object_reports_reused_lines_and_tokens_saved(alice, model, fresh_sim):
    batch = run(alice, [chat(f"q{i % 2}", temperature=0) for i in range(6)])
    answer = alice.client.get(f"/v1/batches/{batch.public_id}").json()
    assert answer["openrelay"]["reuse"] == {
        "mode": "auto",
        "twins": 4,
        "reused": 4,
        "cache_hits": 0,
        "saved_input_tokens": 2 * batch.input_tokens,
        "saved_output_tokens": 2 * batch.output_tokens,
    }
    # OpenAI's usage keeps its five fields, and bills the two calls.
    assert set(answer["usage"]) == {
        "input_tokens",
        "input_tokens_details",
        "output_tokens",
        "output_tokens_details",
        "total_tokens",
    }
    assert answer["usage"]["input_tokens"] == batch.input_tokens
    assert len(fresh_sim.requests()) == 2


def test_an_unknown_reuse_mode_is_refused(alice, model):
    body = {"input_file_id": upload(alice, [chat("q")]), "endpoint": CHAT, "completion_window": "24h"}
    response = alice.client.post("/v1/batches", {**body, "openrelay": {"reuse": "always"}}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "openrelay.reuse"


def test_metrics_count_reused_lines(alice, model, fresh_sim, settings):
    settings.OPENRELAY_METRICS_TOKEN = TOKEN
    batch = run(alice, [chat("same", temperature=0)] * 5)
    text = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").content.decode()
    got = {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert got[("openrelay_reuse_total", frozenset({"model": MODEL, "kind": "reused"}.items()))] == 4
    saved = got[("openrelay_reuse_total", frozenset({"model": MODEL, "kind": "saved_input_tokens"}.items()))]
    assert saved == 4 * batch.input_tokens > 0


def test_the_batch_page_shows_reused_lines(alice, model, fresh_sim, django_user_model):
    batch = run(alice, [chat("same", temperature=0)] * 3)
    user = django_user_model.objects.create_user("alice")
    Membership.objects.create(user=user, organization=alice.org)
    client = Client()
    client.force_login(user)
    page = client.get(f"/batches/{batch.public_id}").content.decode()
    shown = dict(re.findall(r'<span data-field="(reused|cache_hits)">([\d,]+)</span>', page))
    assert shown == {"reused": "2", "cache_hits": "0"}


def test_the_quote_quotes_the_calls_not_the_twins(alice, model):
    def quoted(**openrelay):
        body = {
            "input_file_id": upload(alice, [chat(f"q{i % 4}", temperature=0) for i in range(40)]),
            "endpoint": CHAT,
            "completion_window": "24h",
            **({"openrelay": openrelay} if openrelay else {}),
        }
        response = alice.client.post("/v1/batches/estimate", body, format="json")
        assert response.status_code == 200, response.content
        return response.json()

    merged, off = quoted(), quoted(reuse="off")
    assert merged["request_counts"] == {"total": 40, "rejected": 0, "calls": 4}
    assert off["request_counts"] == {"total": 40, "rejected": 0, "calls": 40}
    assert merged["input_tokens"]["total"] * 10 == off["input_tokens"]["total"]
    assert merged["output_tokens"]["expected"] * 10 == off["output_tokens"]["expected"] > 0
