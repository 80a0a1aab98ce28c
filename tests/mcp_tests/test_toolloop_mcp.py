"""A tool-calling record whose tools live on the official MCP server, end to end.

No database: the record runs through toolloop.run with a hand-built
RecordContext, against the simulated model (which asks for tools when the
request has `tools`) and a real MCPServer.
"""

import asyncio

import pytest

from batches.engine.calls.caller import ModelCaller, Upstream
from batches.engine.context import RecordContext
from batches.engine.loops import toolloop
from batches.engine.store import ClaimedRecord
from openrelay.lib.outbound import OutboundClient
from openrelay.simulator.config import SimulatorConfig
from openrelay.simulator.server import run_in_thread
from tests.fixtures.mcp_servers import AUTHORIZATION, SECRET, rpc_methods

CHAT = "/v1/chat/completions"
SIM_MODEL = "sim-model"
LOOKUP_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a contract up.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
}


@pytest.fixture(scope="module")
def sim():
    with run_in_thread(SimulatorConfig()) as server:
        yield server


def run_record(sim, body):
    async def go():
        caller = ModelCaller([Upstream(sim.base_url, SIM_MODEL, "", 4)], time_limit_s=10.0, retries=0)
        async with caller, OutboundClient(allow_private=True) as outbound:
            ctx = RecordContext(
                batch_pk=1,
                batch_public_id="batch_test",
                organization_id=1,
                endpoint=CHAT,
                model_name=SIM_MODEL,
                caller=caller,
                outbound=outbound,
            )
            return await toolloop.run(ctx, ClaimedRecord(1, 1, "req-1", 0, 0), body)

    return asyncio.run(go())


def mcp_body(text, **tool_config):
    return {
        "model": SIM_MODEL,
        "messages": [{"role": "user", "content": text}],
        "tools": [LOOKUP_TOOL],
        "openrelay": {"tool_config": {"type": "mcp", **tool_config}},
    }


def test_it_answers_with_the_mcp_tool_result(sim, official_server):
    context = {"contractId": "k-7", "tenant": "acme"}
    body = mcp_body('Look up [[tool_args:{"query": "c-42"}]]', url=official_server.url, context=context)

    outcome = run_record(sim, body)

    assert outcome.succeeded, outcome.error_message
    choice = outcome.body["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["content"] == "Final answer using: found c-42"
    assert outcome.body["openrelay"] == {"tool_rounds": 1}
    assert official_server.received == [{"query": "c-42", "_context": context}]
    assert rpc_methods(official_server.seen) == ["initialize", "notifications/initialized", "tools/call"]


def test_it_keeps_one_session_across_rounds(sim, official_server):
    body = mcp_body('[[tool_rounds:3]] [[tool_args:{"query": "q"}]]', url=official_server.url)

    outcome = run_record(sim, body)

    assert outcome.succeeded, outcome.error_message
    assert outcome.body["openrelay"] == {"tool_rounds": 3}
    assert official_server.received == [{"query": "q"}] * 3
    methods = rpc_methods(official_server.seen)
    assert methods == ["initialize", "notifications/initialized"] + ["tools/call"] * 3
    assert len({s.headers["mcp-session-id"] for s in official_server.seen[1:]}) == 1


def test_it_fails_the_record_when_the_server_refuses_the_token(sim, auth_server):
    body = mcp_body("Look it up", url=auth_server.url, authorization="Bearer not-the-token")

    outcome = run_record(sim, body)

    assert not outcome.succeeded
    assert outcome.error_code == "tool_execution_failed"
    assert outcome.error_message == "MCP initialize failed: HTTP 401"


def test_it_runs_with_the_token(sim, auth_server):
    body = mcp_body('[[tool_args:{"query": "x"}]]', url=auth_server.url, authorization=AUTHORIZATION)

    outcome = run_record(sim, body)

    assert outcome.succeeded, outcome.error_message
    assert outcome.body["choices"][0]["message"]["content"] == "Final answer using: found x"
    assert SECRET not in str(outcome.body)
