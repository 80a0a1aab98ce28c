"""Checkpoints through real worker clusters: kill -9 in the middle of tool loops and workflows,
cancel and expiry mid-workflow."""

from collections import defaultdict

import pytest

from batches import services
from batches.models import Batch
from billing.models import LedgerEntry
from tests.fixtures.tool_executor import sleep
from tests.fixtures.workflow_callback import Reply
from tests.helpers import assert_exactly_once, chat, make_batch, read_lines, status_of, wait_for

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
# Short leases: a killed cluster's records are claimable again within 2 s.
FAST = {"OPENRELAY_LEASE_S": 2}


def tool_line(executor, i):
    return chat(f"weather {i} [[tool_rounds:6]]", tools=[TOOL], openrelay={"tool_config": {"url": executor.url}})


def workflow_line(callback, context):
    return {**chat("start"), "openrelay": {"workflow": {"url": callback.url, "context": context}}}


def rounds_seen(executor):
    """(custom_id, the round's tool_call ids) -> the Idempotency-Key of every POST of that round."""
    seen = defaultdict(list)
    for request in list(executor.received):
        ids = tuple(call["id"] for call in request["json"]["tool_calls"])
        seen[(request["json"]["custom_id"], ids)].append(request["headers"]["Idempotency-Key"])
    return seen


@pytest.mark.slow
def test_kill_9_mid_tool_loop_resumes_at_the_round_in_flight(alice, model, executor, clusters):
    executor.answer(sleep(0.3))
    batch = make_batch(alice.org, [tool_line(executor, i) for i in range(6)])
    first = clusters(**FAST)

    def per_record():
        return [sum(1 for cid, _ in rounds_seen(executor) if cid == f"req-{i}") for i in range(1, 7)]

    wait_for(lambda: min(per_record()) >= 2, 30, "every record to reach round 2")
    first.kill()
    assert max(per_record()) < 6, "a record finished before the kill; the test proves nothing"
    clusters(**FAST)
    wait_for(lambda: status_of(batch) == "completed", 60, "the batch to complete")
    out, err = assert_exactly_once(batch, 6)
    assert not err and all(line["response"]["body"]["openrelay"] == {"tool_rounds": 6} for line in out)
    seen = rounds_seen(executor)
    assert len(seen) == 36  # 6 rounds of 6 records
    assert all(len(keys) <= 2 and len(set(keys)) == 1 for keys in seen.values()), seen
    assert len({keys[0] for keys in seen.values()}) == 36  # a different key for every other round
    assert any(len(keys) == 2 for keys in seen.values()), "no round was in flight at the kill"


def steps_by_record(callback):
    steps = defaultdict(list)
    for call in list(callback.calls):
        steps[call.payload["custom_id"]].append((call.payload["step"], call.headers["Idempotency-Key"]))
    return steps


@pytest.mark.slow
def test_a_workflow_killed_at_a_step_resumes_at_that_step(alice, model, callback, clusters):
    alice.org.workflows_enabled = True
    alice.org.save(update_fields=["workflows_enabled"])
    hang = {"at_step_3": True}

    def script(payload):
        if payload["step"] == 3 and hang["at_step_3"]:
            return Reply(hang=True)
        if payload["step"] < 5:
            return {"status": "continue", "requests": [{"id": f"s{payload['step'] + 1}", "body": chat("more")}]}
        return {"status": "completed", "output": "done"}

    callback.answer(script)
    batch = make_batch(alice.org, [workflow_line(callback, None) for _ in range(4)])
    first = clusters(**FAST)

    def at_step_3():
        return sum(any(s == 3 for s, _ in steps) for steps in steps_by_record(callback).values())

    wait_for(lambda: at_step_3() == 4, 30, "every record's callback at step 3")
    first.kill()
    hang["at_step_3"] = False
    clusters(**FAST)
    wait_for(lambda: status_of(batch) == "completed", 60, "the batch to complete")
    out, err = assert_exactly_once(batch, 4)
    assert not err
    for line in out:
        assert line["response"]["body"]["steps"] == 5 and line["response"]["body"]["requests"] == 5
    for custom_id, steps in steps_by_record(callback).items():
        assert [s for s, _ in steps] == [1, 2, 3, 3, 4, 5], (custom_id, steps)
        keys = [k for _, k in steps]
        assert keys[2] == keys[3] and len(set(keys)) == 5


@pytest.mark.slow
def test_cancel_and_expiry_mid_workflow_bill_exactly_the_succeeded_requests(alice, model, callback, clusters):
    alice.org.workflows_enabled = True
    alice.org.save(update_fields=["workflows_enabled"])

    def script(payload):
        if payload["step"] == 1:
            return {
                "status": "continue",
                "requests": [{"id": "p1", "body": chat("one")}, {"id": "p2", "body": chat("two, longer")}],
            }
        return Reply(hang=True)

    callback.answer(script)
    cancelled = make_batch(alice.org, [workflow_line(callback, "cancel") for _ in range(3)])
    expired = make_batch(alice.org, [workflow_line(callback, "expire") for _ in range(3)])
    clusters(**FAST)

    def at_step_2():
        return [c.payload for c in list(callback.calls) if c.payload["step"] == 2]

    wait_for(lambda: len(at_step_2()) == 6, 30, "every record's callback at step 2")
    services.cancel_batch(cancelled)
    Batch.objects.filter(pk=expired.pk).update(expires_at=expired.created_at)
    wait_for(lambda: status_of(cancelled) == "cancelled" and status_of(expired) == "expired", 30, "both to end")
    for batch, context in ((cancelled, "cancel"), (expired, "expire")):
        batch.refresh_from_db()
        usages = [p["usage"] for p in at_step_2() if p["context"] == context]  # root, p1, p2: all succeeded
        assert batch.input_tokens == sum(u["prompt_tokens"] for u in usages) > 0
        assert batch.output_tokens == sum(u["completion_tokens"] for u in usages) > 0
        entry = LedgerEntry.objects.get(batch_id=batch.public_id)
        assert (entry.input_tokens, entry.output_tokens) == (batch.input_tokens, batch.output_tokens)
        errors = read_lines(batch.error_file)
        assert len(errors) == 3 and batch.failed_count == 3
        for line in errors:
            assert "reached step 2 and sent 3 requests" in line["error"]["message"]
        assert sorted(int(line["error"]["message"].split("; ")[1].split()[0]) for line in errors) == sorted(
            u["total_tokens"] for u in usages
        )
