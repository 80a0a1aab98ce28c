"""Checkpoints in-process: a claimed record that carries one continues from it, the store
keeps it under the lease only, a hand-back keeps it, the flush drops it."""

import pytest

from batches.engine import checkpoints, cut, store
from batches.engine.runner import run_batch
from batches.models import Record
from tests.helpers import chat, make_batch, read_lines

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
OWNER = "test-engine"


@pytest.fixture(autouse=True)
def _private_urls(settings):
    settings.OPENRELAY_ALLOW_PRIVATE_URLS = True  # the executor and the callback listen on 127.0.0.1


def tool_body(executor, rounds):
    return chat(f"weather [[tool_rounds:{rounds}]]", tools=[TOOL], openrelay={"tool_config": {"url": executor.url}})


def round_messages(n):
    """What rounds 0..n-1 of the simulator's tool loop add to the conversation."""
    added = []
    for r in range(n):
        call = {"id": f"call_{r}_0", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
        added.append({"role": "assistant", "content": None, "tool_calls": [call]})
        added.append({"role": "tool", "tool_call_id": call["id"], "content": f"sunny {r}"})
    return added


def hand_back_with(batch, state):
    """A run that got this far and handed the record back (SIGTERM): claim, checkpoint, release."""
    (claimed,) = store.claim(batch.pk, OWNER, 1)
    assert store.save_checkpoints(OWNER, {claimed.pk: checkpoints.encode(state)}) == {claimed.pk}
    assert store.release(OWNER, [claimed.pk]) == 1
    return claimed


def key(batch, *parts):
    return checkpoints.idempotency_key(":".join(map(str, (batch.public_id, 1, *parts))))


def test_it_resumes_a_tool_record_after_its_last_round(alice, model, executor):
    batch = make_batch(alice.org, [tool_body(executor, 3)])
    hand_back_with(
        batch, {"kind": "tools", "rounds": 2, "usage": [100, 0, 10, 0], "added": round_messages(2), "pending": None}
    )
    run_batch(batch.pk)
    batch.refresh_from_db()
    # Rounds 1 and 2 are not executed again: round 3 is the first the executor sees.
    assert executor.tool_call_ids() == [["call_2_0"]]
    assert executor.received[0]["headers"]["Idempotency-Key"] == key(batch, "round", 3)
    (line,) = read_lines(batch.output_file)
    body = line["response"]["body"]
    assert body["openrelay"] == {"tool_rounds": 3}
    assert body["usage"]["prompt_tokens"] > 100 and batch.input_tokens == body["usage"]["prompt_tokens"]
    assert Record.objects.get(batch=batch).checkpoint is None


def test_it_runs_the_checkpointed_turns_tool_calls_without_asking_the_model_again(alice, model, executor):
    batch = make_batch(alice.org, [tool_body(executor, 2)])
    added = round_messages(2)
    hand_back_with(
        batch, {"kind": "tools", "rounds": 1, "usage": [100, 0, 10, 0], "added": added[:2], "pending": added[2]}
    )
    run_batch(batch.pk)
    batch.refresh_from_db()
    assert executor.tool_call_ids() == [["call_1_0"]]  # the pending turn's calls, as the model asked them
    assert executor.received[0]["headers"]["Idempotency-Key"] == key(batch, "round", 2)
    (line,) = read_lines(batch.output_file)
    assert line["response"]["body"]["openrelay"] == {"tool_rounds": 2}
    assert line["response"]["body"]["choices"][0]["finish_reason"] == "stop"


def test_it_resumes_a_workflow_at_its_step_in_flight(alice, model, callback):
    alice.org.workflows_enabled = True
    alice.org.save(update_fields=["workflows_enabled"])
    body = {**chat("start"), "openrelay": {"workflow": {"url": callback.url}}}
    batch = make_batch(alice.org, [body])
    done = {"id": "a", "status": "succeeded", "response": {"status_code": 200, "body": {}}, "error": None}
    hand_back_with(
        batch,
        {
            "kind": "workflow",
            "steps": 2,
            "requests": 3,
            "usage": [50, 0, 5, 0],
            "ids": ["a", "b", "root"],
            "next": [["a", chat("a")], ["b", chat("b")]],
            "done": {"a": done},
            "results": None,
        },
    )
    callback.answer(lambda payload: {"status": "completed", "output": payload["step"]})
    run_batch(batch.pk)
    batch.refresh_from_db()
    (payload,) = callback.payloads  # step 1 is never called back again
    assert payload["step"] == 2 and [r["id"] for r in payload["results"]] == ["a", "b"]
    assert payload["results"][0] is not None and payload["results"][0] == done  # not run again
    assert callback.calls[0].headers["Idempotency-Key"] == key(batch, "step", 2)
    (line,) = read_lines(batch.output_file)
    assert line["response"]["body"]["steps"] == 2 and line["response"]["body"]["requests"] == 3
    assert batch.input_tokens == payload["usage"]["prompt_tokens"] > 50


def test_a_checkpoint_is_written_only_under_the_lease_and_dropped_by_the_flush(alice, model):
    batch = make_batch(alice.org, [chat("a"), chat("b")])
    first, second = store.claim(batch.pk, OWNER, 2)
    blob = checkpoints.encode({"kind": "tools", "rounds": 1})
    assert store.save_checkpoints(OWNER, {first.pk: blob, second.pk: blob}) == {first.pk, second.pk}
    assert store.save_checkpoints("someone-else", {first.pk: b"{}"}) == set()
    assert store.release(OWNER, [first.pk]) == 1
    assert store.save_checkpoints(OWNER, {first.pk: b"{}"}) == set()  # handed back: not ours
    (again,) = store.claim(batch.pk, "next-engine", 1)
    assert again.pk == first.pk and checkpoints.decode(again.checkpoint) == {"kind": "tools", "rounds": 1}
    from batches.engine.outcomes import RecordOutcome

    store.flush(batch.pk, OWNER, [(second, RecordOutcome(True, 200, "r", {}))])
    assert Record.objects.get(pk=second.pk).checkpoint is None
    assert Record.objects.get(pk=first.pk).checkpoint is not None


def test_large_states_are_compressed():
    state = {"kind": "tools", "added": [{"role": "tool", "content": "x" * 10_000}]}
    data = checkpoints.encode(state)
    assert data[:1] == b"z" and len(data) < 1000 and checkpoints.decode(data) == state
    assert checkpoints.decode(checkpoints.encode({"kind": "tools"})) == {"kind": "tools"}


def test_records_cut_mid_way_keep_what_their_checkpoints_say_their_answers_came_to(alice, model):
    # A cancel or the expiry closes records its engine still held: a contract record is billed the
    # answers it got (issue 56), a tool-calling record's turns are unbilled usage, a plain one bills nothing.
    batch = make_batch(alice.org, [chat("contract"), chat("tools"), chat("plain")])
    contract_record, tool_record, _ = store.claim(batch.pk, OWNER, 3)
    states = {
        contract_record.pk: {"kind": "contract", "reasks": 2, "usage": [100, 64, 10, 0], "added": []},
        tool_record.pk: {"kind": "tools", "rounds": 1, "usage": [40, 0, 4, 0], "added": [], "pending": None},
    }
    store.save_checkpoints(OWNER, {pk: checkpoints.encode(state) for pk, state in states.items()})
    assert cut.close_unfinished(batch.pk, "cancelled", "batch_cancelled", "Cancelled.") == 3
    batch.refresh_from_db()
    assert (batch.failed_count, batch.input_tokens, batch.cached_tokens, batch.output_tokens) == (3, 100, 64, 10)
    assert (batch.unbilled_input_tokens, batch.unbilled_output_tokens) == (40, 4)
    records = {r.line: r for r in Record.objects.filter(batch=batch)}
    assert records[1].error_message == "Cancelled. It had made 2 re-asks; 110 tokens of its 2 answers are billed."
    assert (records[2].prompt_tokens, records[2].unbilled_prompt_tokens) == (0, 40)
    assert records[2].error_message == records[3].error_message == "Cancelled."
    assert all(r.checkpoint is None and r.status == "cancelled" for r in records.values())
