"""The engine keeps the guardrails: a paused batch claims nothing and resumes where it stopped,
a cap pauses a batch before it can pass it, the breaker pauses a batch whose records are wrong."""

import time
from decimal import Decimal

import pytest
from django.utils import timezone

from batches import guardrails, services
from batches.engine import breaker
from batches.engine.outcomes import RecordOutcome
from batches.models import Batch, PauseReason
from billing.models import LedgerEntry
from billing.pricing import batch_cost, unbilled_cost
from tests.fixtures.tool_executor import status
from tests.guardrails_tests.helpers import finished, fresh, priced_batch, running
from tests.helpers import EngineThread, assert_exactly_once, chat, make_batch, wait_for

pytestmark = pytest.mark.django_db(transaction=True)
NANOS_PER_CALL = 1_000_000  # 100 answer tokens at $10 / 1M


def _paused(batch):
    return fresh(batch).paused_at is not None


def _calls_settle(sim, batch):
    """Wait until the batch has no record running: its calls in flight have come back."""
    wait_for(lambda: running(batch) == 0, 10, "calls in flight to finish")
    return sim.request_count


def test_a_paused_batch_claims_nothing_and_resumes_where_it_stopped(alice, model, sim):
    model.deployments.update(max_concurrency=8)
    batch = priced_batch(alice.org, 200, text="[[latency:40]] q")
    with EngineThread(batch.pk):
        wait_for(lambda: finished(batch) >= 24, 30, "records to run")
        guardrails.pause_batch(fresh(batch))
        paused_at = time.monotonic()
        calls = _calls_settle(sim, batch)
        # In-flight calls came back (the engine polls pauses every 0.05 s; the bound is a loaded machine's).
        assert time.monotonic() - paused_at < 5.0
        # Absence takes time to see: a few of the engine's polls (0.05 s each) pass with no call.
        time.sleep(0.5)
        assert sim.request_count == calls
        done = finished(fresh(batch))
        assert done < 200 and fresh(batch).status == "in_progress"
        guardrails.resume_batch(fresh(batch))
        resumed_at = time.monotonic()
        # Resumed at the next poll; 5 s: a loaded machine's bound, where a missed resume never comes.
        wait_for(lambda: sim.request_count > calls, 5.0, "calls again soon after resume")
        assert time.monotonic() - resumed_at < 5.0
        wait_for(lambda: fresh(batch).status == "completed", 60, "the batch to complete")
    assert_exactly_once(batch, 200)
    assert sim.request_count == 200  # no record sent twice


@pytest.mark.parametrize(("asked", "drawn"), [(100, 100), (200, 50)])
def test_a_spend_cap_pauses_the_batch_before_it_passes_the_cap(alice, model, sim, asked, drawn):
    # Worst case `asked` tokens a call, each draws `drawn`: 0.0205 USD pays for 20 calls of 100 tokens, and for
    # 38 of 50 when each may draw 200 (the 39th's worst case would pass the cap).
    cap = 20 * NANOS_PER_CALL + NANOS_PER_CALL // 2
    batch = priced_batch(alice.org, 120, text=f"[[tokens:{drawn}]] q", max_cost_nanos=cap, max_tokens=asked)
    with EngineThread(batch.pk):
        wait_for(lambda: _paused(batch), 30, "the cap to pause the batch")
        _calls_settle(sim, batch)
        wait_for(lambda: fresh(batch).completed_count == finished(batch), 5, "the last results to flush")
        batch = fresh(batch)
        spent = batch_cost(batch).total_nanos
        assert batch.pause_reason == PauseReason.SPEND_CAP and batch.pause_detail["code"] == "spend_cap_reached"
        assert spent <= cap
        # Every call ran until what is left could not pay for one more's worst case.
        assert batch.completed_count == (cap - asked * 10_000) // (drawn * 10_000) + 1
        guardrails.resume_batch(batch, max_cost_nanos=10**9)
        wait_for(lambda: fresh(batch).status == "completed", 60, "the resumed batch to complete")
    assert_exactly_once(batch, 120)
    assert sim.request_count == 120


def test_the_breaker_pauses_a_batch_whose_every_record_is_refused(alice, model, sim):
    batch = priced_batch(alice.org, 2000, text="[[status:400]] q", breaker=(100, 20, 50))
    with EngineThread(batch.pk):
        wait_for(lambda: _paused(batch), 30, "the breaker to pause the batch")
        _calls_settle(sim, batch)
    batch = fresh(batch)
    assert batch.pause_reason == PauseReason.ERROR_BREAKER and batch.status == "in_progress"
    detail = batch.pause_detail
    assert detail["code"].startswith("400 ") and detail["failures"] >= 20
    assert detail["custom_id"].startswith("req-") and detail["line"] >= 1
    assert f"line {detail['line']}" in detail["message"]
    assert finished(batch) <= 200  # not 2,000: the window, the calls in flight and a claim-ahead at most


def test_the_breaker_trips_on_failures_in_a_row_after_a_good_start(alice, model, sim):
    model.deployments.update(max_concurrency=8)
    # Lines past 150 are refused by the model: the first 100 were fine, the run of failures is not.
    bodies = [
        chat(f"[[latency:20]] q {i}") if i < 150 else chat(f"[[latency:20]] [[status:400]] q {i}") for i in range(400)
    ]
    batch = make_batch(alice.org, bodies)
    Batch.objects.filter(pk=batch.pk).update(breaker_window=100, breaker_failures=20, breaker_consecutive=30)
    with EngineThread(batch.pk):
        wait_for(lambda: _paused(batch), 30, "the breaker to pause the batch")
        _calls_settle(sim, batch)
    batch = fresh(batch)
    assert batch.pause_reason == PauseReason.ERROR_BREAKER
    assert "in a row" in batch.pause_detail["message"] and batch.pause_detail["line"] > 150
    assert batch.failed_count < 150  # of 250 to come


def test_the_deployments_failures_never_trip_the_breaker(alice, model, sim):
    # Every record's first attempt draws a 502 (the deployment's fault; the engine sends it again).
    batch = priced_batch(alice.org, 30, text="[[status:502x1]] q", breaker=(10, 2, 2))
    with EngineThread(batch.pk):
        wait_for(lambda: fresh(batch).status == "completed", 60, "the batch to complete")
    batch = fresh(batch)
    assert batch.paused_at is None and batch.pause_reason == ""
    assert (batch.completed_count, batch.failed_count) == (30, 0)


@pytest.mark.parametrize(
    ("outcome", "counts"),
    [
        (RecordOutcome(False, 500, body={"error": {"code": "boom"}}), False),
        (RecordOutcome(False, 502), False),
        (RecordOutcome(False, 401, body={"error": {"code": "invalid_api_key"}}), False),
        (RecordOutcome(False, 403), False),
        (RecordOutcome(False, 429), False),
        (RecordOutcome.error("upstream_error", "The model server failed."), False),
        (RecordOutcome.error("request_time_limit", "slow"), False),
        (RecordOutcome(False, 400, body={"error": {"code": "unsupported_parameter", "message": "no"}}), True),
        (RecordOutcome(False, 404, body={"error": {"type": "not_found_error"}}), True),
        (RecordOutcome.error("tool_call_failed", "the tool server said 500"), True),
    ],
)
def test_only_the_batchs_own_failures_count(outcome, counts):
    key = breaker.failure_of(outcome)
    assert (key is not None and key is not breaker.SUCCEEDED) == counts


def test_a_batch_paused_until_its_window_ends_expires_and_bills_what_ran(alice, model, sim):
    batch = priced_batch(alice.org, 300, text="[[latency:30]] q")
    with EngineThread(batch.pk):
        wait_for(lambda: finished(batch) >= 20, 30, "records to run")
        guardrails.pause_batch(fresh(batch))
        _calls_settle(sim, batch)
        Batch.objects.filter(pk=batch.pk).update(expires_at=timezone.now())
        wait_for(lambda: fresh(batch).status == "expired", 30, "the paused batch to expire")
    batch = fresh(batch)
    assert batch.completed_count >= 20
    entry = LedgerEntry.objects.get(batch_id=batch.public_id)
    assert entry.output_tokens == batch.output_tokens > 0 and entry.batch_status == "expired"
    assert batch.paused_at is None and batch.pause_reason == "requested"


def test_a_batch_cancelled_while_paused_is_cancelled(alice, model, sim):
    batch = priced_batch(alice.org, 300, text="[[latency:30]] q")
    with EngineThread(batch.pk):
        wait_for(lambda: finished(batch) >= 20, 30, "records to run")
        guardrails.pause_batch(fresh(batch))
        _calls_settle(sim, batch)
        services.cancel_batch(fresh(batch))
        wait_for(lambda: fresh(batch).status == "cancelled", 30, "the paused batch to be cancelled")
    assert LedgerEntry.objects.filter(batch_id=batch.public_id).exists()


def test_an_organization_budget_pauses_its_running_batches(alice, model, sim):
    alice.org.monthly_budget = Decimal("0.01")  # ten calls of 100 tokens
    alice.org.save()
    batch = priced_batch(alice.org, 100, text="[[tokens:100]] q", max_tokens=100)
    with EngineThread(batch.pk):
        wait_for(lambda: _paused(batch), 30, "the budget to pause the batch")
        _calls_settle(sim, batch)
    batch = fresh(batch)
    assert batch.pause_reason == PauseReason.ORGANIZATION_BUDGET
    assert batch_cost(batch).total_nanos <= 10**7
    assert batch.completed_count == 10
    with pytest.raises(guardrails.BudgetExceeded):
        guardrails.check_budget(alice.org)


# A tool turn of ~100 completion tokens (its function's name and these arguments): 1,000,000 nanos.
BIG_ARGS = '[[tool_args:{"city": "' + "x" * 370 + '"}]]'
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


@pytest.mark.parametrize("guard", ["max_cost", "budget"])
def test_unbilled_tool_turns_count_against_the_cap_and_the_budget(alice, model, sim, executor, settings, guard):
    # Every record's first turn asks for tools and its executor fails: the record is billed nothing
    # (batch-api.txt), but the turn's tokens count against max_cost and the budget all the same.
    # Before issue 56 they were forgotten as each record ended, and all 60 records ran. Two calls
    # at a time: with more, ten turns answered while their executors are still to fail fill the cap
    # at once, forgotten or not.
    model.deployments.update(max_concurrency=2)
    settings.OPENRELAY_ALLOW_PRIVATE_URLS = True
    executor.answer(status(500))
    if guard == "budget":
        alice.org.monthly_budget = Decimal("0.01")  # ten such turns
        alice.org.save(update_fields=["monthly_budget"])
    cap = 10 * NANOS_PER_CALL if guard == "max_cost" else None
    tools = {"tools": [WEATHER], "openrelay": {"tool_config": {"url": executor.url}}, "max_tokens": 100}
    batch = priced_batch(alice.org, 60, text=f"{BIG_ARGS} q", max_cost_nanos=cap, **tools)
    with EngineThread(batch.pk):
        wait_for(lambda: _paused(batch) or fresh(batch).status == "completed", 30, "the batch to pause or end")
        _calls_settle(sim, batch)
        wait_for(lambda: fresh(batch).failed_count == finished(batch), 5, "the last results to flush")
    batch = fresh(batch)
    reason = PauseReason.SPEND_CAP if guard == "max_cost" else PauseReason.ORGANIZATION_BUDGET
    assert batch.pause_reason == reason
    assert batch_cost(batch).total_nanos == 0  # billed nothing
    counted = unbilled_cost(batch).total_nanos
    per_turn = counted // batch.failed_count
    assert 0.9 * NANOS_PER_CALL <= per_turn <= NANOS_PER_CALL  # the turns are what this test means them to be
    assert counted <= 10 * NANOS_PER_CALL and batch.failed_count >= 8
    assert sim.request_count == batch.failed_count < 60
    assert guardrails.organization_spend_nanos(alice.org.pk) == counted
