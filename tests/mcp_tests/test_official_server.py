"""The MCP executor against the official `mcp` server (MCPServer, Streamable HTTP)."""

import pytest

from batches.engine.tools.base import ToolExecutionFailed, ToolResult
from batches.engine.tools.mcp import CLIENT_NAME, CLIENT_VERSION
from tests.fixtures.mcp_servers import AUTHORIZATION, SECRET, rpc_methods

from .conftest import config, run_rounds, tool_call

ACCEPT = "application/json, text/event-stream"


def test_it_handshakes_once_then_calls_with_the_session(official_server):
    [results] = run_rounds(config(official_server.url), [tool_call()])

    assert results == [ToolResult("call_0_0", "found c-42")]
    init, note, call = official_server.seen
    assert rpc_methods(official_server.seen) == ["initialize", "notifications/initialized", "tools/call"]
    params = init.message["params"]
    assert params["protocolVersion"] == "2025-06-18"
    assert params["capabilities"] == {}
    assert params["clientInfo"] == {"name": CLIENT_NAME, "version": CLIENT_VERSION}
    assert CLIENT_NAME == "openrelay-batch-worker"
    assert "mcp-session-id" not in init.headers
    session = init.response_headers["mcp-session-id"]
    for later in (note, call):
        assert later.headers["mcp-session-id"] == session
        assert later.headers["mcp-protocol-version"] == "2025-06-18"
    assert "id" not in note.message and note.status == 202
    assert all(s.method == "POST" and s.headers["accept"] == ACCEPT for s in official_server.seen)
    assert call.message["params"] == {"name": "lookup", "arguments": {"query": "c-42"}}
    assert call.response_headers["content-type"].startswith("text/event-stream")


def test_it_keeps_the_handshake_across_rounds(official_server):
    first, second = run_rounds(
        config(official_server.url),
        [tool_call(arguments='{"query": "a"}')],
        [tool_call(arguments='{"query": "b"}', call_id="call_1_0")],
    )

    assert first == [ToolResult("call_0_0", "found a")]
    assert second == [ToolResult("call_1_0", "found b")]
    assert rpc_methods(official_server.seen) == ["initialize", "notifications/initialized", "tools/call", "tools/call"]


def test_it_merges_the_context_under__context(official_server):
    context = {"contractId": "k-7", "tags": ["a", 1, None]}

    [results] = run_rounds(config(official_server.url, context=context), [tool_call()])

    assert results[0].content == "found c-42"
    assert official_server.received == [{"query": "c-42", "_context": context}]


def test_it_sends_no__context_without_a_context(official_server):
    run_rounds(config(official_server.url), [tool_call()])

    assert official_server.received == [{"query": "c-42"}]
    assert "_context" not in official_server.seen[-1].message["params"]["arguments"]


def test_it_runs_a_turns_calls_and_keeps_their_order(official_server):
    calls = [tool_call(arguments=f'{{"query": "q{i}"}}', call_id=f"call_0_{i}") for i in range(3)]
    calls.append(tool_call("pair", "{}", "call_0_3"))

    [results] = run_rounds(config(official_server.url), calls)

    assert results == [
        ToolResult("call_0_0", "found q0"),
        ToolResult("call_0_1", "found q1"),
        ToolResult("call_0_2", "found q2"),
        # A list result is one text item per element, joined with "\n".
        ToolResult("call_0_3", "first\nsecond"),
    ]
    assert rpc_methods(official_server.seen).count("initialize") == 1


def test_it_delivers_tool_errors_as_content(official_server):
    [results] = run_rounds(
        config(official_server.url),
        [tool_call("refuse", "{}"), tool_call("no_such_tool", "{}", "call_0_1")],
    )

    assert results == [
        ToolResult("call_0_0", "Error executing tool refuse: contract is locked"),
        ToolResult("call_0_1", "Unknown tool: no_such_tool"),
    ]


@pytest.mark.filterwarnings("ignore:The logging capability is deprecated")
def test_it_reads_the_result_after_a_notification_on_the_stream(official_server):
    [results] = run_rounds(config(official_server.url), [tool_call("chatty", "{}")])

    assert results == [ToolResult("call_0_0", "done talking")]
    stream = official_server.seen[-1].response_body
    assert b"\r\n" in stream  # the server's own CRLF framing
    assert stream.index(b"notifications/message") < stream.index(b"done talking")


def test_it_talks_to_a_stateless_json_server(stateless_server):
    [results] = run_rounds(config(stateless_server.url, context={"k": 1}), [tool_call()])

    assert results == [ToolResult("call_0_0", "found c-42")]
    assert stateless_server.received == [{"query": "c-42", "_context": {"k": 1}}]
    init, _note, call = stateless_server.seen
    assert "mcp-session-id" not in init.response_headers
    assert "mcp-session-id" not in call.headers
    assert call.headers["mcp-protocol-version"] == "2025-06-18"
    assert call.response_headers["content-type"].startswith("application/json")


def test_it_sends_the_authorization_on_every_request(auth_server):
    [results] = run_rounds(config(auth_server.url, authorization=AUTHORIZATION), [tool_call()])

    assert results == [ToolResult("call_0_0", "found c-42")]
    assert len(auth_server.seen) == 3
    assert all(s.headers["authorization"] == AUTHORIZATION for s in auth_server.seen)


@pytest.mark.parametrize("authorization", [None, "Bearer wrong-token-value"])
def test_it_fails_when_the_server_refuses_the_token(auth_server, authorization):
    with pytest.raises(ToolExecutionFailed) as failed:
        run_rounds(config(auth_server.url, authorization=authorization), [tool_call()])

    assert str(failed.value) == "MCP initialize failed: HTTP 401"
    assert SECRET not in str(failed.value)
    assert rpc_methods(auth_server.seen) == ["initialize"]


def test_every_tools_call_carries_an_idempotency_key_stable_for_its_round_and_place(official_server):
    import asyncio

    from batches.engine.checkpoints import idempotency_key
    from batches.engine.tools.mcp import McpExecutor
    from openrelay.lib.outbound import OutboundClient

    two = [tool_call(arguments='{"query": "a"}'), tool_call(arguments='{"query": "b"}', call_id="call_0_1")]

    async def run(round_key):
        async with OutboundClient(allow_private=True) as outbound:
            executor = McpExecutor(outbound, "req-1", config(official_server.url))
            try:
                return await executor.execute(two, key=round_key)
            finally:
                await executor.close()

    asyncio.run(run("round-key-1"))
    asyncio.run(run("round-key-1"))  # the same round again (a resumed record): the same keys
    asyncio.run(run("round-key-2"))
    calls = [s for s in official_server.seen if s.message and s.message.get("method") == "tools/call"]
    keys = [(c.message["params"]["arguments"]["query"], c.headers["idempotency-key"]) for c in calls]
    first, again, other = keys[0:2], keys[2:4], keys[4:6]
    assert sorted(first) == sorted(again)
    assert {k for _, k in first} == {idempotency_key("round-key-1:call:0"), idempotency_key("round-key-1:call:1")}
    assert not {k for _, k in first} & {k for _, k in other}
    # The handshake's keys are fresh each time: it is not a step to deduplicate.
    inits = [
        s.headers.get("idempotency-key")
        for s in official_server.seen
        if s.message and s.message.get("method") == "initialize"
    ]
    assert len(set(inits)) == len(inits) == 3
