"""Each completion window bills its rate on a real worker cluster: the ledger, the batch's cost and the
organization's usage agree, expedited pays the sync price, a short window expires on time, and one
survives a kill -9 of its cluster mid-run inside its window, at its rate."""

from decimal import Decimal

import pytest

from batches.models import Batch, Engine, Record
from billing.models import LedgerEntry
from tests.billing_tests.conftest import as_usd, create, oracle_cost, usage_of_lines
from tests.helpers import chat, read_lines, status_of, succeeded, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WINDOWS = "5s:0.9,1h:0.8,24h:0.5,72h:0.4"


def _billed_right(persona, batch, multiplier):
    batch.refresh_from_db()
    prompt, cached, completion = usage_of_lines(read_lines(batch.output_file))
    assert prompt > 0 and batch.price_multiplier == multiplier
    entry = LedgerEntry.objects.get(batch_id=batch.public_id)
    assert (entry.input_tokens, entry.cached_tokens, entry.output_tokens) == (prompt, cached, completion)
    expected = oracle_cost(prompt, cached, completion, multiplier)
    assert entry.total_cost_nanos == expected[3]
    shown = persona.client.get(f"/v1/batches/{batch.public_id}").json()
    assert shown["openrelay"]["cost"]["total"] == as_usd(expected[3])
    return entry


def test_each_window_bills_its_rate_and_a_short_one_expires_on_time(alice, model, clusters, settings):
    settings.OPENRELAY_COMPLETION_WINDOWS = WINDOWS
    bodies = [chat(f"q{i}") for i in range(4)]
    batches = {
        ("1h", "standard"): create(alice, bodies, completion_window="1h"),
        ("24h", "standard"): create(alice, bodies, completion_window="24h"),
        ("72h", "standard"): create(alice, bodies, completion_window="72h"),
        ("72h", "expedited"): create(alice, bodies, completion_window="72h", priority="expedited"),
    }
    clusters()
    # The 5 s batch once an engine is live: a cluster starting on a loaded machine can take longer than
    # its whole window (its first record then never ran: nothing billed at 0.9).
    wait_for(lambda: Engine.objects.exists(), 90, "an engine to start")
    short = create(alice, [chat("quick"), chat("stuck [[hang]]")], completion_window="5s")
    for batch in batches.values():
        wait_for(lambda batch=batch: status_of(batch) == "completed", 90, f"{batch.public_id} to complete")
    wait_for(lambda: status_of(short) == "expired", 90, "the 5 s batch to expire")

    entries = [_billed_right(alice, batches[("1h", "standard")], Decimal("0.8"))]
    entries.append(_billed_right(alice, batches[("24h", "standard")], Decimal("0.5")))
    entries.append(_billed_right(alice, batches[("72h", "standard")], Decimal("0.4")))
    entries.append(_billed_right(alice, batches[("72h", "expedited")], Decimal("1.0")))
    entries.append(_billed_right(alice, short, Decimal("0.9")))

    short.refresh_from_db()
    # Expired at its window's end, not a day later: the sweep closes it within seconds of expires_at.
    assert (short.expires_at - short.created_at).total_seconds() == 5
    assert (short.finalizing_at - short.expires_at).total_seconds() < 30
    assert {line["error"]["code"] for line in read_lines(short.error_file)} == {"batch_expired"}
    # The organization's usage (the billing lines) is the sum of the ledger entries.
    total = alice.client.get("/v1/organization/usage").json()["total"]
    assert total["cost"]["total"] == as_usd(sum(entry.total_cost_nanos for entry in entries))
    assert Batch.objects.filter(organization=alice.org).count() == 5


def test_kill_9_mid_run_keeps_a_short_windows_deadline_and_its_rate(alice, model, clusters, settings):
    """A 60 s batch on a real cluster; kill -9 of that cluster mid-run, another started: the batch still
    completes inside its window, and its billing lines, batch and ledger bill the window's rate."""
    settings.OPENRELAY_COMPLETION_WINDOWS = windows = "60s:0.8,24h:0.5"
    model.deployments.update(max_concurrency=8)
    first = clusters(OPENRELAY_Q_WORKERS=1, OPENRELAY_COMPLETION_WINDOWS=windows)
    wait_for(lambda: Engine.objects.exists(), 60, "the first cluster's engine")  # its start is not the batch's
    # 64 calls of 0.4 s, 8 at a time: ~3.2 s of work, the kill in its middle.
    batch = create(alice, [chat(f"q{i} [[latency:400]]") for i in range(64)], completion_window="60s")
    running = Record.objects.filter(batch=batch, status="running")
    wait_for(lambda: succeeded(batch) >= 8 and running.exists(), 30, "the batch mid-run")
    first.kill()
    done_at_kill = succeeded(batch)
    assert done_at_kill < 64, "the batch finished before the kill; the test proves nothing"
    clusters(OPENRELAY_Q_WORKERS=1, OPENRELAY_COMPLETION_WINDOWS=windows)
    wait_for(lambda: status_of(batch) in ("completed", "expired"), 60, "the batch to end")

    batch.refresh_from_db()
    assert batch.status == "completed" and batch.completed_at < batch.expires_at, (batch.status, done_at_kill)
    assert (batch.expires_at - batch.created_at).total_seconds() == 60
    assert (batch.completed_count, batch.failed_count) == (64, 0)
    shown = alice.client.get(f"/v1/batches/{batch.public_id}").json()["openrelay"]
    assert 0 < shown["time_to_first_result"] < shown["time_to_complete"] < 60
    entry = _billed_right(alice, batch, Decimal("0.8"))  # billing lines (the output file) = batch = ledger
    total = alice.client.get("/v1/organization/usage").json()["total"]
    assert total["cost"]["total"] == as_usd(entry.total_cost_nanos)
