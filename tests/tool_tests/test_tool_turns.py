"""What counts as a tool round: a message with tool_calls, whatever its finish_reason. Against a
tiny real model server that answers tool calls with finish_reason "stop" (as some vLLM tool
parsers and llama.cpp do)."""

import asyncio

import pytest
from aiohttp import web

from batches.engine.calls.caller import ModelCaller, Upstream
from batches.engine.loops.toolloop import run as run_tools
from batches.engine.store import ClaimedRecord
from openrelay.lib.outbound import OutboundClient
from openrelay.simulator.server import AppThread
from tests.tool_tests.conftest import record_context

USAGE = {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}


def completion(message):
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "m",
        "usage": USAGE,
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
    }


class StopModel:
    """Asks for one tool call per turn (finish_reason "stop") until `rounds` tool messages are in."""

    def __init__(self, rounds):
        self.rounds = rounds
        self.bodies = []

    async def handle(self, request):
        body = await request.json()
        self.bodies.append(body)
        done = sum(1 for m in body["messages"] if m.get("role") == "tool")
        if done >= self.rounds:
            return web.json_response(completion({"role": "assistant", "content": "all done"}))
        call = {"id": f"call_{done}", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
        return web.json_response(completion({"role": "assistant", "content": None, "tool_calls": [call]}))


@pytest.fixture
def stop_model():
    def start(rounds):
        server = StopModel(rounds)
        app = web.Application()
        app.router.add_post("/v1/chat/completions", server.handle)
        server.thread = AppThread(app, name="stop-model").start()
        started.append(server.thread)
        return server

    started = []
    yield start
    for thread in started:
        thread.stop()


def run_against(server, body):
    async def go():
        caller = ModelCaller([Upstream(server.thread.url + "/v1", "m", "", 4)], time_limit_s=10.0, retries=0)
        async with caller, OutboundClient(allow_private=True) as outbound:
            return await run_tools(record_context(caller, outbound), ClaimedRecord(1, 1, "req-1", 0, 0), body)

    return asyncio.run(go())


def body(executor, max_rounds):
    return {
        "model": "m",
        "messages": [{"role": "user", "content": "look it up"}],
        "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}],
        "openrelay": {"tool_config": {"url": executor.url, "max_rounds": max_rounds}},
    }


def test_it_runs_tool_calls_whose_turn_says_stop(stop_model, executor):
    server = stop_model(2)
    outcome = run_against(server, body(executor, 8))
    assert outcome.succeeded
    assert executor.tool_call_ids() == [["call_0"], ["call_1"]]
    assert outcome.body["choices"][0]["message"]["content"] == "all done"
    assert outcome.body["openrelay"] == {"tool_rounds": 2}
    assert outcome.body["usage"]["prompt_tokens"] == 30 and outcome.usage.completion_tokens == 6
    assert [m["role"] for m in server.bodies[-1]["messages"]] == ["user", "assistant", "tool", "assistant", "tool"]


def test_exhausted_rounds_store_the_last_response_as_it_came(stop_model, executor):
    server = stop_model(99)
    outcome = run_against(server, body(executor, 1))
    assert outcome.succeeded and len(executor.received) == 1
    choice = outcome.body["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["tool_calls"][0]["id"] == "call_1"
    assert outcome.body["openrelay"] == {"tool_rounds": 1}
