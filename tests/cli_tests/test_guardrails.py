"""orl batches create --max-cost, pause and resume [--max-cost] against a live server (no worker needed)."""

import json

from batches.models import Batch
from tests.cli_tests.conftest import CHAT, chat, write_jsonl


def _created(orl, tmp_path, *extra):
    result = orl("--json", "batches", "create", "-f", write_jsonl(tmp_path / "in.jsonl", chat("a")), "-e", CHAT, *extra)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_it_creates_with_a_spend_cap(orl, alice, model, tmp_path):
    batch = _created(orl, tmp_path, "--max-cost", "12.50")
    assert batch["openrelay"]["max_cost"] == "12.500000000"
    assert Batch.objects.get().max_cost_nanos == 12_500_000_000


def test_it_refuses_a_bad_cap_before_uploading(orl, alice, model, tmp_path):
    result = orl(
        "batches", "create", "-f", write_jsonl(tmp_path / "in.jsonl", chat("a")), "-e", CHAT, "--max-cost", "-3"
    )
    assert result.exit_code == 2 and "above 0" in result.output
    assert alice.client.get("/v1/files").json()["data"] == []


def test_it_pauses_shows_why_and_resumes_with_a_new_cap(orl, alice, model, tmp_path):
    batch_id = _created(orl, tmp_path, "--max-cost", "1")["id"]
    paused = orl("batches", "pause", batch_id)
    assert paused.exit_code == 0, paused.output
    assert "validating (paused)" in paused.stdout and "requested since" in paused.stdout
    assert "Paused by its owner." in paused.stdout
    shown = orl("batches", "get", batch_id)
    assert "(paused)" in shown.stdout and "1.000000000 USD" in shown.stdout
    assert "(paused)" in orl("batches", "list").stdout
    resumed = orl("--json", "batches", "resume", batch_id, "--max-cost", "2")
    assert resumed.exit_code == 0, resumed.output
    body = json.loads(resumed.stdout)
    assert body["openrelay"]["paused"] is None and body["openrelay"]["max_cost"] == "2.000000000"


def test_it_reports_a_refused_pause_with_its_code(orl, alice, model, tmp_path):
    batch_id = _created(orl, tmp_path)["id"]
    Batch.objects.filter(public_id=batch_id).update(status="completed")
    result = orl("batches", "pause", batch_id)
    assert result.exit_code != 0 and "batch_not_pausable" in result.output


def test_limits_show_the_budget_and_this_months_spend(orl, alice, model):
    assert "organization monthly budget" in orl("limits").stdout
    alice.org.monthly_budget = 5
    alice.org.save()
    shown = orl("limits")
    assert shown.exit_code == 0, shown.output
    assert "0.000000000 of 5.000000000 USD spent this month" in shown.stdout
