"""What is billed, through the real engine and the simulated model.

Each test runs a batch with run_batch and checks the ledger entry against
usage computed without the engine: the simulator's answers are a pure
function of the request body, so replaying the bodies it received gives each
call's usage.
"""

from batches.engine.calls.caller import Usage
from batches.engine.runner import run_batch
from batches.models import Record, RecordStatus
from openrelay.simulator.answers import answer_chat
from tests.billing_tests.conftest import (
    LONG,
    WEATHER_TOOL,
    as_usd,
    assert_billed,
    create,
    first_message,
    run_batch_in_thread,
    usage_of_lines,
)
from tests.fixtures.tool_executor import per_record, status
from tests.helpers import CHAT, MODEL, chat, read_lines, wait_for


def replayed_usage(sim, keep):
    """The usage the simulator charged for every call whose body `keep` accepts."""
    bodies = [body for body in sim.bodies(CHAT) if keep(body)]
    return sum((Usage.from_body(answer_chat(body)) for body in bodies), Usage())


def test_it_bills_successful_plain_records_and_not_failed_or_timed_out_ones(alice, model, sim, settings):
    settings.OPENRELAY_CALL_TIME_LIMIT_S = 0.5
    batch = create(
        alice, [chat("fine"), chat(LONG), chat(LONG + "[[status:400]]"), chat(LONG + "[[hang]]"), chat("also fine")]
    )
    run_batch(batch.pk)
    batch.refresh_from_db()
    assert (batch.status, batch.completed_count, batch.failed_count) == ("completed", 3, 2)
    output = read_lines(batch.output_file)
    assert [line["custom_id"] for line in output] == ["req-1", "req-2", "req-5"]
    errors = {line["custom_id"]: line for line in read_lines(batch.error_file)}
    assert errors["req-4"]["error"]["code"] == "request_time_limit"
    # The ledger is the sum of the usage on the output lines...
    prompt, cached, completion = usage_of_lines(output)
    assert cached > 0
    entry = assert_billed(batch, prompt, cached, completion)
    # ...which is what the model charged for the successful calls only.
    billed = replayed_usage(sim, lambda body: "[[" not in first_message(body))
    assert (billed.prompt_tokens, billed.cached_tokens, billed.completion_tokens) == (prompt, cached, completion)
    assert Record.objects.filter(batch=batch, status="failed", prompt_tokens__gt=0).count() == 0
    # The batch's cost (openrelay.cost) ends equal to the ledger entry.
    shown = alice.client.get(f"/v1/batches/{batch.public_id}").json()
    usage = shown["usage"]
    assert shown["openrelay"]["cost"]["total"] == as_usd(entry.total_cost_nanos)
    assert (usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"], usage["output_tokens"]) == (
        prompt,
        cached,
        completion,
    )


def tool_record(text, url):
    return {**chat(text), "tools": [WEATHER_TOOL], "openrelay": {"tool_config": {"url": url}}}


def test_it_bills_a_tool_calling_record_the_sum_of_its_turns_only_when_it_succeeds(alice, model, sim, executor):
    executor.answer(per_record({"req-2": status(500)}))
    texts = ("Weather twice [[tool_rounds:2]]", "Fails on its tool call [[tool_rounds:2]]")
    batch = create(alice, [tool_record(text, executor.url) for text in texts])
    run_batch(batch.pk)
    batch.refresh_from_db()
    [line] = read_lines(batch.output_file)
    [failed] = read_lines(batch.error_file)
    assert line["custom_id"] == "req-1" and line["response"]["body"]["openrelay"] == {"tool_rounds": 2}
    assert failed["error"]["code"] == "tool_execution_failed"
    # Three turns for the successful record, billed summed; the failed record's first turn is not billed.
    turns = replayed_usage(sim, lambda body: first_message(body) == texts[0])
    assert len([b for b in sim.bodies(CHAT) if first_message(b) == texts[0]]) == 3
    assert replayed_usage(sim, lambda body: first_message(body) == texts[1]).prompt_tokens > 0
    assert usage_of_lines([line]) == (turns.prompt_tokens, turns.cached_tokens, turns.completion_tokens)
    assert_billed(batch, turns.prompt_tokens, turns.cached_tokens, turns.completion_tokens)


def test_it_bills_every_successful_request_of_a_workflow_record(alice, model, sim, callback, settings):
    settings.OPENRELAY_CALL_TIME_LIMIT_S = 1
    alice.org.workflows_enabled = True
    alice.org.save(update_fields=["workflows_enabled"])

    def script(payload):
        if payload["step"] == 1:
            # A request stopped at the call limit comes back failed and is not billed.
            requests = [
                {"id": "page", "body": chat(f"page of {payload['custom_id']}")},
                {"id": "slow", "body": chat("never answers [[hang]]")},
            ]
            return {"status": "continue", "requests": requests}
        if payload["custom_id"] == "req-2":
            return {"status": "failed", "error": {"message": "Rejected by the callback."}}
        return {"status": "completed", "output": {"ok": True}}

    callback.answer(script)
    workflow = {"url": callback.url}
    batch = create(
        alice,
        [
            {**chat("first record"), "openrelay": {"workflow": workflow}},
            {**chat("second record"), "openrelay": {"workflow": workflow}},
        ],
    )
    run_batch(batch.pk)
    batch.refresh_from_db()
    assert (batch.completed_count, batch.failed_count) == (1, 1)
    step2 = [p for p in callback.payloads if p["step"] == 2]
    assert all(r["status"] == "failed" for p in step2 for r in p["results"] if r["id"] == "slow")
    # Both records, completed or failed, bill their successful requests: roots and pages, not the hung calls.
    billed = replayed_usage(sim, lambda body: "[[hang]]" not in first_message(body))
    assert len([b for b in sim.bodies(CHAT) if "[[hang]]" not in first_message(b)]) == 4
    assert_billed(batch, billed.prompt_tokens, billed.cached_tokens, billed.completion_tokens)


def succeeded(batch, count):
    return lambda: Record.objects.filter(batch=batch, status=RecordStatus.SUCCEEDED).count() >= count


def test_an_expired_batch_bills_its_completed_work(alice, model, sim, settings):
    settings.OPENRELAY_COMPLETION_WINDOWS = "2s:0.5,24h:0.5"
    batch = create(
        alice, [chat("quick"), chat(LONG), chat("stuck [[hang]]"), chat("stuck too [[hang]]")], completion_window="2s"
    )
    run_batch(batch.pk)  # returns once the window has passed and the batch is closed
    batch.refresh_from_db()
    assert batch.status == "expired"
    output = read_lines(batch.output_file)
    assert len(output) == 2
    assert {line["error"]["code"] for line in read_lines(batch.error_file)} == {"batch_expired"}
    prompt, cached, completion = usage_of_lines(output)
    assert prompt > 0
    entry = assert_billed(batch, prompt, cached, completion)
    assert entry.batch_status == "expired"


def test_a_cancelled_batch_bills_what_finished(alice, model, sim):
    batch = create(alice, [chat("quick"), chat(LONG)] + [chat(f"slow {i} [[hang]]") for i in range(3)])
    worker = run_batch_in_thread(batch)
    wait_for(succeeded(batch, 2), 10, "two records to succeed")
    response = alice.client.post(f"/v1/batches/{batch.public_id}/cancel")
    assert response.status_code == 200
    worker.join(15)
    assert not worker.is_alive()
    batch.refresh_from_db()
    assert batch.status == "cancelled"
    output = read_lines(batch.output_file)
    assert len(output) == 2
    assert {line["error"]["code"] for line in read_lines(batch.error_file)} == {"batch_cancelled"}
    entry = assert_billed(batch, *usage_of_lines(output))
    assert entry.batch_status == "cancelled" and entry.model_name == MODEL
