"""The tool loop against the simulated model and a real executor server.

No database: a record runs through toolloop.run with a hand-built
RecordContext, as the worker would run it.
"""

import asyncio

import orjson
import pytest

from batches.engine.calls.caller import ModelCaller, Upstream, Usage
from batches.engine.loops import dispatch, toolloop
from batches.engine.store import ClaimedRecord
from batches.engine.tools.http_executor import HttpExecutor
from openrelay.lib.outbound import OutboundClient
from tests.fixtures.tool_executor import ok, sleep, status
from tests.tool_tests.conftest import CHAT, SIM_MODEL, record_context

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CLOCK_TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
SECRET = "Bearer tool-secret-123"


def plain_body(text="What is the weather in Paris?", tools=(WEATHER_TOOL,)):
    return {"model": SIM_MODEL, "messages": [{"role": "user", "content": text}], "tools": list(tools)}


def tool_body(executor, text="What is the weather in Paris?", tools=(WEATHER_TOOL,), **config):
    return {**plain_body(text, tools), "openrelay": {"tool_config": {"url": executor.url, **config}}}


def test_it_runs_one_round(sim, executor, run_record):
    outcome = run_record(tool_body(executor)).outcome

    assert outcome.succeeded and outcome.status_code == 200
    choice = outcome.body["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["content"] == "Final answer using: get_weather result for call_0_0"
    assert outcome.body["openrelay"] == {"tool_rounds": 1}
    assert executor.tool_call_ids() == [["call_0_0"]]
    assert len(sim.bodies(CHAT)) == 2


def test_it_sends_the_protocol_payload(sim, executor, run_record):
    body = tool_body(executor, context={"contractId": "c-42"})
    run = run_record(body, custom_id="inv-0042")

    [request] = executor.received
    assert request["path"] == "/tools"
    assert set(request["json"]) == {"custom_id", "context", "tool_calls"}
    assert request["json"]["custom_id"] == "inv-0042"
    assert request["json"]["context"] == {"contractId": "c-42"}
    first_turn = run.model_results[0].body["choices"][0]["message"]
    assert request["json"]["tool_calls"] == first_turn["tool_calls"]
    assert request["headers"]["Content-Type"] == "application/json"


def test_it_sends_null_context_and_no_authorization_when_absent(sim, executor, run_record):
    run_record(tool_body(executor))

    [request] = executor.received
    assert request["json"]["context"] is None
    assert "Authorization" not in request["headers"]


def test_it_appends_the_assistant_message_as_returned_and_one_tool_message_per_result(sim, executor, run_record):
    run = run_record(tool_body(executor))

    second = sim.bodies(CHAT)[1]
    assistant = run.model_results[0].body["choices"][0]["message"]
    assert second["messages"] == [
        {"role": "user", "content": "What is the weather in Paris?"},
        assistant,
        {"role": "tool", "tool_call_id": "call_0_0", "content": "get_weather result for call_0_0"},
    ]


def test_it_runs_several_rounds(sim, executor, run_record):
    outcome = run_record(tool_body(executor, "Weather? [[tool_rounds:3]]")).outcome

    assert outcome.succeeded
    assert outcome.body["openrelay"] == {"tool_rounds": 3}
    assert outcome.body["choices"][0]["finish_reason"] == "stop"
    assert executor.tool_call_ids() == [["call_0_0"], ["call_1_0"], ["call_2_0"]]
    assert len(sim.bodies(CHAT)) == 4
    last = sim.bodies(CHAT)[-1]["messages"]
    assert [m["role"] for m in last] == ["user", "assistant", "tool", "assistant", "tool", "assistant", "tool"]


def test_it_runs_parallel_calls_and_keeps_the_order_of_the_tool_calls(sim, executor, run_record):
    # The executor answers in reverse order; the tool messages follow the calls.
    executor.answer(ok(reverse=True))
    outcome = run_record(tool_body(executor, "Both [[tool_calls:2]]", tools=(WEATHER_TOOL, CLOCK_TOOL))).outcome

    assert outcome.succeeded and outcome.body["openrelay"] == {"tool_rounds": 1}
    assert executor.tool_call_ids() == [["call_0_0", "call_0_1"]]
    tool_messages = [m for m in sim.bodies(CHAT)[1]["messages"] if m["role"] == "tool"]
    assert tool_messages == [
        {"role": "tool", "tool_call_id": "call_0_0", "content": "get_weather result for call_0_0"},
        {"role": "tool", "tool_call_id": "call_0_1", "content": "get_time result for call_0_1"},
    ]


def test_it_stores_exhausted_rounds_as_a_normal_output_line(sim, executor, run_record):
    run = run_record(tool_body(executor, "Loop [[tool_rounds:5]]", max_rounds=2))
    outcome = run.outcome

    assert outcome.succeeded and outcome.error_code == ""
    assert outcome.body["choices"][0]["finish_reason"] == "tool_calls"
    assert outcome.body["openrelay"] == {"tool_rounds": 2}
    assert len(sim.bodies(CHAT)) == 3
    assert len(executor.received) == 2
    # Billed like any output line: every turn.
    assert outcome.usage == sum((r.usage for r in run.model_results), Usage())


def test_it_clamps_max_rounds_to_16(sim, executor, run_record):
    outcome = run_record(tool_body(executor, "Forever [[tool_rounds:99]]", max_rounds=99)).outcome

    assert len(sim.bodies(CHAT)) == 17
    assert len(executor.received) == 16
    assert outcome.body["openrelay"] == {"tool_rounds": 16}
    assert outcome.body["choices"][0]["finish_reason"] == "tool_calls"


def test_it_takes_8_rounds_when_max_rounds_is_0(sim, executor, run_record):
    outcome = run_record(tool_body(executor, "Forever [[tool_rounds:99]]", max_rounds=0)).outcome

    assert len(sim.bodies(CHAT)) == 9
    assert outcome.body["openrelay"] == {"tool_rounds": 8}


def test_it_sums_usage_over_every_turn(sim, executor, run_record):
    # A long question: over 128 prompt tokens, so the simulator reports cached tokens.
    text = "Weather? [[tool_rounds:2]] " + "Please be thorough. " * 40
    run = run_record(tool_body(executor, text))
    outcome = run.outcome

    turns = [r.usage for r in run.model_results]
    assert len(turns) == 3
    total = sum(turns, Usage())
    assert total.cached_tokens > 0
    assert outcome.usage == total
    assert outcome.body["usage"] == {
        "prompt_tokens": total.prompt_tokens,
        "completion_tokens": total.completion_tokens,
        "total_tokens": total.prompt_tokens + total.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": total.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }
    assert outcome.body["usage"]["prompt_tokens"] > turns[-1].prompt_tokens


def test_it_strips_openrelay_before_every_model_call(sim, executor, run_record):
    body = tool_body(executor, "Weather? [[tool_rounds:2]]", authorization=SECRET, context={"k": "v"})
    run_record(body)

    sent = sim.bodies(CHAT)
    assert len(sent) == 3
    assert all("openrelay" not in b for b in sent)
    # openrelay carried only tool_config: the model sees the hand-written body.
    assert sent[0] == plain_body("Weather? [[tool_rounds:2]]")
    assert SECRET not in orjson.dumps(sim.requests()).decode()


def test_it_delivers_non_string_content_as_json_text(sim, executor, run_record):
    executor.answer(ok(content=lambda call: {"temp_c": 21, "sky": ["clear"]}))
    run_record(tool_body(executor))

    tool_message = sim.bodies(CHAT)[1]["messages"][-1]
    assert tool_message["content"] == '{"temp_c":21,"sky":["clear"]}'


def test_it_sends_authorization_as_the_header_and_never_in_the_outcome(sim, executor, run_record):
    executor.answer(ok(), status(500))
    body = tool_body(executor, "Weather? [[tool_rounds:2]]", authorization=SECRET)
    outcome = run_record(body).outcome

    assert [r["headers"]["Authorization"] for r in executor.received] == [SECRET, SECRET]
    assert outcome.error_code == "tool_execution_failed"
    assert "tool-secret" not in orjson.dumps(vars(outcome), default=str).decode()

    executor.reset()
    outcome = run_record(body).outcome
    assert outcome.succeeded
    assert "tool-secret" not in orjson.dumps(vars(outcome), default=str).decode()
    assert "tool_config" not in orjson.dumps(outcome.body).decode()


def test_it_leaves_records_without_tool_config_on_the_plain_path(sim, executor, run_record):
    outcome = run_record(plain_body(), entry=dispatch.run_record).outcome

    assert outcome.succeeded
    assert outcome.body["choices"][0]["finish_reason"] == "tool_calls"
    assert "openrelay" not in outcome.body
    assert len(sim.bodies(CHAT)) == 1
    assert executor.received == []


def test_it_dispatches_tool_config_records_to_the_loop(sim, executor, run_record):
    outcome = run_record(tool_body(executor), entry=dispatch.run_record).outcome

    assert outcome.body["openrelay"] == {"tool_rounds": 1}
    assert len(executor.received) == 1


def test_it_answers_without_rounds_when_the_model_calls_no_tool(sim, executor, run_record):
    outcome = run_record(tool_body(executor, "Hi [[tool_rounds:0]]")).outcome

    assert outcome.succeeded
    assert "openrelay" not in outcome.body
    assert executor.received == []


def test_it_rejects_an_invalid_tool_config_without_calling_the_model(sim, executor, run_record):
    outcome = run_record(tool_body(executor, max_rounds=-1)).outcome

    assert outcome.error_code == "invalid_tool_config"
    assert sim.bodies(CHAT) == []


def test_it_fails_the_record_when_a_turn_hits_the_call_limit(sim, executor, run_record):
    # A directive in a tool message affects the next model call: it never answers.
    executor.answer(ok(content=lambda call: "[[hang]]"))
    outcome = run_record(tool_body(executor), time_limit_s=0.5).outcome

    assert not outcome.succeeded
    assert outcome.error_code == "request_time_limit"
    assert outcome.usage == Usage()


def test_it_keeps_a_non_2xx_model_answer_as_the_result_and_bills_nothing(sim, executor, run_record):
    executor.answer(ok(content=lambda call: "[[status:400]]"))
    run = run_record(tool_body(executor))
    outcome = run.outcome

    assert not outcome.succeeded
    assert outcome.status_code == 400
    assert outcome.body["error"]["type"]
    assert outcome.usage == Usage()
    # The turn before it got an answer: not billed (batch-api.txt), but kept as unbilled usage.
    assert outcome.unbilled == sum((r.usage for r in run.model_results if r.ok), Usage()) != Usage()


def test_it_fails_alone_when_the_model_server_drops_its_calls_and_answers_others(sim, executor, run_record):
    executor.answer(ok(content=lambda call: "[[drop]]"))
    outcome = run_record(tool_body(executor)).outcome

    # The server answered the engine's neutral request meanwhile: the failures are the record's own.
    assert outcome.error_code == "record_fails_upstream"
    assert "while it answered other requests" in outcome.error_message
    assert outcome.usage == Usage()


def test_it_bills_nothing_when_the_executor_fails_mid_loop(sim, executor, run_record):
    executor.answer(ok(), ok(), status(503))
    run = run_record(tool_body(executor, "Weather? [[tool_rounds:5]]"))

    assert len(run.model_results) == 3  # two rounds ran and were paid for upstream
    assert run.outcome.error_code == "tool_execution_failed"
    assert run.outcome.error_message == "The tool executor answered with non-2xx status 503."
    assert run.outcome.usage == Usage()
    # Their tokens are unbilled usage: counted against max_cost and the budget, never charged.
    assert run.outcome.unbilled == sum((r.usage for r in run.model_results), Usage())
    assert run.outcome.body is None


def test_it_runs_a_record_again_from_the_start(sim, executor, run_record):
    # A lost lease reruns the record: the executor sees the same ids again,
    # and each run's outcome carries only its own usage.
    body = tool_body(executor, "Weather? [[tool_rounds:2]]")
    first = run_record(body).outcome
    second = run_record(body).outcome

    assert executor.tool_call_ids() == [["call_0_0"], ["call_1_0"], ["call_0_0"], ["call_1_0"]]
    assert second.usage == first.usage
    assert second.body["usage"] == first.body["usage"]


@pytest.fixture
def closed(monkeypatch):
    """custom_ids of the executors the loop closed (make_executor is the only way to see them)."""
    closed = []

    class Spy(HttpExecutor):
        async def close(self):
            closed.append(self.custom_id)
            await super().close()

    monkeypatch.setattr(toolloop, "make_executor", lambda ctx, custom_id, config: Spy(ctx.outbound, custom_id, config))
    return closed


def test_it_closes_the_executor_on_success_and_on_failure(sim, executor, run_record, closed):
    assert run_record(tool_body(executor), custom_id="a").outcome.succeeded
    executor.answer(status(500))
    assert run_record(tool_body(executor), custom_id="b").outcome.error_code == "tool_execution_failed"
    executor.answer(ok(content=lambda call: "[[hang]]"))
    assert run_record(tool_body(executor), custom_id="c", time_limit_s=0.3).outcome.error_code == "request_time_limit"
    assert closed == ["a", "b", "c"]


def test_it_closes_the_executor_when_the_record_is_cancelled(sim, executor, closed):
    # The worker cancels in-flight records when their batch is cancelled or expires.
    executor.answer(sleep(30))

    async def go():
        caller = ModelCaller([Upstream(sim.base_url, SIM_MODEL, "", 8)], time_limit_s=10, retries=0)
        async with caller, OutboundClient(allow_private=True) as outbound:
            task = asyncio.create_task(
                toolloop.run(record_context(caller, outbound), ClaimedRecord(1, 1, "r", 0, 0), tool_body(executor))
            )
            deadline = asyncio.get_running_loop().time() + 5
            while not executor.received and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.01)  # polling with a deadline for the executor call to start
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(go())
    assert len(executor.received) == 1
    assert closed == ["r"]
