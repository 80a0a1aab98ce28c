"""The MCP executor against a hand-written server: what the official one never does."""

import asyncio
import json
import socket

import pytest
from aiohttp import web

from batches.engine.tools.base import ToolExecutionFailed, ToolResult
from openrelay.lib.outbound import HOST_REFUSED, OutboundClient
from tests.fixtures.mcp_servers import AUTHORIZATION, SECRET, rpc_methods

from .conftest import (
    SESSION,
    McpExecutor,
    accepted,
    config,
    execute_rounds,
    handshake_ok,
    init_result,
    rpc_response,
    scripted_server,
    sse_response,
    text_result,
    tool_call,
)


def run_scripted(handler, *rounds, **extra):
    """Start a scripted server, run the rounds; (results or the failure, what the server saw)."""

    async def scenario():
        async with scripted_server(handler) as server:
            try:
                outcome = await execute_rounds(config(server.url, authorization=AUTHORIZATION, **extra), *rounds)
            except ToolExecutionFailed as exc:
                outcome = exc
            return outcome, server.seen

    return asyncio.run(scenario())


def http_error(status, code, message):
    """An HTTP-level error as the official server sends it (id null)."""
    return web.json_response({"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}, status=status)


def call_answered_with(answer):
    """A handler: normal handshake, then `answer(seen)` for tools/call."""

    async def handler(seen):
        return await handshake_ok(seen) or await answer(seen)

    return handler


def failure_of(handler, *rounds, **extra):
    outcome, seen = run_scripted(handler, *(rounds or [[tool_call()]]), **extra)
    assert isinstance(outcome, ToolExecutionFailed), outcome
    message = str(outcome)
    assert SECRET not in message and SESSION not in message
    return message, seen


# --- handshake -------------------------------------------------------------


@pytest.mark.parametrize("status", [404, 405])
def test_it_skips_the_handshake_on_a_stateless_server(status):
    async def handler(seen):
        if seen.rpc_method == "initialize":
            return web.Response(status=status)
        return rpc_response(seen, result=text_result("stateless ok"))

    (first, second), seen = run_scripted(handler, [tool_call()], [tool_call(call_id="call_1_0")])

    assert first == [ToolResult("call_0_0", "stateless ok")]
    assert second == [ToolResult("call_1_0", "stateless ok")]
    # One initialize for the record loop, then straight to tools/call.
    assert rpc_methods(seen) == ["initialize", "tools/call", "tools/call"]
    for call in seen[1:]:
        assert "mcp-session-id" not in call.headers
        assert "mcp-protocol-version" not in call.headers
        assert call.headers["authorization"] == AUTHORIZATION


@pytest.mark.parametrize("status", [401, 403, 400, 500, 503])
def test_it_fails_on_any_other_handshake_status(status):
    async def handler(seen):
        return web.json_response({"error": "invalid_token", "echo": AUTHORIZATION}, status=status)

    message, seen = failure_of(handler)

    assert message == f"MCP initialize failed: HTTP {status}"
    assert rpc_methods(seen) == ["initialize"]  # never went on without the handshake


def test_it_fails_on_a_jsonrpc_error_to_initialize():
    async def handler(seen):
        return rpc_response(seen, error={"code": -32602, "message": "Invalid request parameters"})

    message, _ = failure_of(handler)

    assert message == "MCP initialize failed: JSON-RPC error -32602: Invalid request parameters"


def test_it_fails_on_a_protocol_version_it_does_not_speak():
    async def handler(seen):
        return rpc_response(seen, result=init_result("2024-11-05"))

    message, seen = failure_of(handler)

    assert message == "MCP initialize failed: the server offered a protocol version this worker does not speak"
    assert rpc_methods(seen) == ["initialize"]


@pytest.mark.parametrize("version", ["2025-03-26", "2025-11-25"])
def test_it_sends_the_negotiated_protocol_version(version):
    async def handler(seen):
        if seen.rpc_method == "initialize":
            return rpc_response(seen, result=init_result(version))
        if seen.rpc_method == "notifications/initialized":
            return accepted()
        return rpc_response(seen, result=text_result("ok"))

    (results,), seen = run_scripted(handler, [tool_call()])

    assert results[0].content == "ok"
    assert [s.headers.get("mcp-protocol-version") for s in seen] == [None, version, version]
    assert all("mcp-session-id" not in s.headers for s in seen)  # none issued


def test_it_fails_when_initialized_is_refused():
    async def handler(seen):
        if seen.rpc_method == "initialize":
            return rpc_response(seen, result=init_result(), headers={"Mcp-Session-Id": SESSION})
        return web.Response(status=400)

    message, seen = failure_of(handler)

    assert message == "MCP notifications/initialized failed: HTTP 400"
    assert rpc_methods(seen) == ["initialize", "notifications/initialized"]


def test_it_refuses_an_invalid_session_id():
    async def handler(seen):
        return rpc_response(seen, result=init_result(), headers={"Mcp-Session-Id": "two words"})

    message, _ = failure_of(handler)

    assert message == "MCP initialize failed: the server sent an invalid Mcp-Session-Id"


def test_it_starts_a_new_session_when_the_server_forgot_it():
    sessions = iter(["s-1", "s-2"])

    async def handler(seen):
        if seen.rpc_method == "initialize":
            return rpc_response(seen, result=init_result(), headers={"Mcp-Session-Id": next(sessions)})
        if seen.rpc_method == "notifications/initialized":
            return accepted()
        if seen.headers["mcp-session-id"] == "s-1":
            return http_error(404, -32600, "Session not found")
        return rpc_response(seen, result=text_result("after renewal"))

    calls = [tool_call(call_id="call_0_0"), tool_call(call_id="call_0_1")]
    (results,), seen = run_scripted(handler, calls)

    assert [r.content for r in results] == ["after renewal", "after renewal"]
    # Both concurrent calls hit the 404; the session is renewed once.
    assert rpc_methods(seen).count("initialize") == 2
    assert [s.headers.get("mcp-session-id") for s in seen if s.rpc_method == "tools/call"][-2:] == ["s-2", "s-2"]


def test_it_gives_up_when_the_new_session_is_refused_too():
    async def handler(seen):
        if seen.rpc_method == "tools/call":
            return web.Response(status=404)
        return await handshake_ok(seen)

    message, seen = failure_of(handler)

    assert message == "MCP tools/call 'lookup' failed: HTTP 404"
    assert rpc_methods(seen) == ["initialize", "notifications/initialized", "tools/call"] * 2


# --- arguments and content -------------------------------------------------


def test_it_sends_the_arguments_and_the_context():
    async def answer(seen):
        return rpc_response(seen, result=text_result(json.dumps(seen.message["params"], sort_keys=True)))

    context = {"contractId": "k-1"}
    arguments = '{"query": "x", "_context": "from the model", "n": [1, 2]}'
    (results,), seen = run_scripted(call_answered_with(answer), [tool_call(arguments=arguments)], context=context)

    # The reserved key always carries the record's context.
    assert json.loads(results[0].content) == {
        "name": "lookup",
        "arguments": {"query": "x", "n": [1, 2], "_context": {"contractId": "k-1"}},
    }


def test_it_sends_no_context_key_when_context_is_absent():
    async def answer(seen):
        return rpc_response(seen, result=text_result(json.dumps(seen.message["params"]["arguments"])))

    (results,), _ = run_scripted(call_answered_with(answer), [tool_call(arguments="")])

    # An empty arguments string is a call without arguments.
    assert results[0].content == "{}"


@pytest.mark.parametrize(
    "arguments, problem",
    [
        ('{"query": ', "the arguments are not valid JSON"),
        ("[1, 2]", "the arguments are not a JSON object"),
        ('"text"', "the arguments are not a JSON object"),
        ("null", "the arguments are not a JSON object"),
    ],
)
def test_it_refuses_arguments_that_are_not_an_object(arguments, problem):
    message, seen = failure_of(call_answered_with(None), [tool_call(arguments=arguments)])

    assert message == f"MCP tools/call 'lookup' failed: {problem}"
    assert seen == []  # checked before anything is sent


def test_it_sends_nothing_for_a_turn_without_calls():
    (results,), seen = run_scripted(call_answered_with(None), [])

    assert results == [] and seen == []


def test_it_refuses_a_call_without_a_function_name():
    message, seen = failure_of(call_answered_with(None), [{"id": "call_0_0", "type": "function", "function": {}}])

    assert message == "MCP tools/call failed: a tool call has no function name"
    assert seen == []


def test_it_joins_the_text_items_and_skips_the_rest():
    result = {
        "content": [
            {"type": "text", "text": "line one"},
            {"type": "image", "data": "aGk=", "mimeType": "image/png"},
            {"type": "resource_link", "uri": "file:///x", "name": "x"},
            {"type": "text", "text": "line two", "annotations": {"priority": 1}},
            {"type": "future_kind", "text": "not text"},
        ],
        "structuredContent": {"ignored": True},
    }

    async def answer(seen):
        return rpc_response(seen, result=result)

    (results,), _ = run_scripted(call_answered_with(answer), [tool_call()])

    assert results == [ToolResult("call_0_0", "line one\nline two")]


def test_it_delivers_an_empty_content_list_as_empty_text():
    async def answer(seen):
        return rpc_response(seen, result={"content": []})

    (results,), _ = run_scripted(call_answered_with(answer), [tool_call()])

    assert results == [ToolResult("call_0_0", "")]


def test_it_delivers_is_error_text_to_the_model():
    async def answer(seen):
        return rpc_response(seen, result=text_result("quota exceeded", "try later", is_error=True))

    (results,), _ = run_scripted(call_answered_with(answer), [tool_call()])

    assert results == [ToolResult("call_0_0", "quota exceeded\ntry later")]


# --- event streams ---------------------------------------------------------


def test_it_reads_a_hand_framed_stream():
    async def answer(seen):
        rid = seen.message["id"]
        result = json.dumps({"jsonrpc": "2.0", "id": rid, "result": text_result("streamed")}, indent=1)
        data = "".join(f"data: {line}\r\n" for line in result.split("\n"))  # multi-line data
        stream = (
            ": ping - 2026-12-02 11:34:03\r\n"
            "id: p0\r\ndata:\r\n\r\n"  # priming event: empty data
            'event: message\r\ndata: {"jsonrpc":"2.0","method":"notifications/progress",'
            '"params":{"progressToken":1,"progress":0.5}}\r\n\r\n'
            # another request's response and a server request: not ours
            f"event: message\r\nid: e1\r\nretry: 3000\r\n"
            f'data: {{"jsonrpc":"2.0","id":{rid + 100},"result":{{"content":[]}}}}\r\n\r\n'
            f'event: message\r\ndata: {{"jsonrpc":"2.0","id":{rid + 100},"method":"sampling/createMessage"}}\r\n\r\n'
            f"event: message\r\n{data}\r\n"
        )
        return sse_response(stream)

    (results,), _ = run_scripted(call_answered_with(answer), [tool_call()])

    assert results == [ToolResult("call_0_0", "streamed")]


@pytest.mark.parametrize("newline", ["\n", "\r"])
def test_it_reads_streams_with_lf_or_cr_endings(newline):
    async def answer(seen):
        message = json.dumps({"jsonrpc": "2.0", "id": seen.message["id"], "result": text_result("ok")})
        return sse_response(f"event: message{newline}data: {message}{newline}{newline}")

    (results,), _ = run_scripted(call_answered_with(answer), [tool_call()])

    assert results[0].content == "ok"


def test_it_reads_the_initialize_answer_from_a_stream():
    async def handler(seen):
        if seen.rpc_method == "initialize":
            message = json.dumps({"jsonrpc": "2.0", "id": seen.message["id"], "result": init_result()})
            response = sse_response(f"event: message\r\ndata: {message}\r\n\r\n")
            response.headers["Mcp-Session-Id"] = SESSION
            return response
        if seen.rpc_method == "notifications/initialized":
            return accepted()
        return rpc_response(seen, result=text_result("ok"))

    (results,), seen = run_scripted(handler, [tool_call()])

    assert results[0].content == "ok"
    assert seen[-1].headers["mcp-session-id"] == SESSION


# --- failures --------------------------------------------------------------


def test_it_fails_on_a_jsonrpc_error():
    async def answer(seen):
        return rpc_response(seen, error={"code": -32602, "message": "Unknown tool: lookup"})

    message, _ = failure_of(call_answered_with(answer))

    assert message == "MCP tools/call 'lookup' failed: JSON-RPC error -32602: Unknown tool: lookup"


def test_it_fails_on_a_jsonrpc_error_in_a_stream():
    async def answer(seen):
        error = {"jsonrpc": "2.0", "id": seen.message["id"], "error": {"code": -32603, "message": "Internal error"}}
        return sse_response(f"data: {json.dumps(error)}\n\n")

    message, _ = failure_of(call_answered_with(answer))

    assert message == "MCP tools/call 'lookup' failed: JSON-RPC error -32603: Internal error"


def test_it_scrubs_secrets_a_server_echoes():
    async def answer(seen):
        echoed = f"bad header {seen.headers['authorization']} in session {seen.headers['mcp-session-id']}"
        return rpc_response(seen, error={"code": -32000, "message": echoed})

    message, _ = failure_of(call_answered_with(answer))

    assert (
        message == "MCP tools/call 'lookup' failed: JSON-RPC error -32000: bad header [redacted] in session [redacted]"
    )


def test_it_cuts_long_server_messages_short():
    async def answer(seen):
        return rpc_response(seen, error={"code": -32000, "message": "x" * 5000})

    message, _ = failure_of(call_answered_with(answer))

    assert len(message) < 400 and message.endswith("...")


@pytest.mark.parametrize(
    "response, problem",
    [
        (lambda: web.Response(status=500, text="Traceback ..."), "HTTP 500"),
        (lambda: web.Response(status=502), "HTTP 502"),
        (
            lambda: http_error(400, -32600, "Bad Request: Missing session ID"),
            "HTTP 400 (JSON-RPC error -32600: Bad Request: Missing session ID)",
        ),
        (lambda: web.Response(status=302, headers={"Location": "http://169.254.169.254/"}), "HTTP 302"),
    ],
    ids=["500", "502", "400 with a JSON-RPC body", "redirect"],
)
def test_it_fails_on_a_non_2xx_answer(response, problem):
    async def answer(seen):
        return response()

    message, _ = failure_of(call_answered_with(answer))

    assert message == f"MCP tools/call 'lookup' failed: {problem}"


@pytest.mark.parametrize(
    "response, problem",
    [
        (lambda seen: web.Response(text="{not json", content_type="application/json"), "the body is not valid JSON"),
        (
            lambda seen: web.Response(text="hello", content_type="text/plain"),
            "the Content-Type is neither application/json nor text/event-stream",
        ),
        (lambda seen: sse_response("data: {broken\n\n"), "an event's data is not valid JSON"),
        (
            lambda seen: sse_response(": nothing but a ping\n\n"),
            "the event stream ended without a response to the request",
        ),
        (
            lambda seen: web.json_response({"jsonrpc": "2.0", "id": 999, "result": {}}),
            "the body is not a JSON-RPC response to the request",
        ),
        (lambda seen: web.json_response([1, 2]), "the body is not a JSON-RPC response to the request"),
        (lambda seen: rpc_response(seen, result={"text": "no content list"}), "the result has no content list"),
        (lambda seen: rpc_response(seen, result="a string"), "the result is not an object"),
        (lambda seen: web.Response(status=202), "the Content-Type is neither application/json nor text/event-stream"),
    ],
    ids=[
        "bad json",
        "content type",
        "bad event data",
        "no response in stream",
        "other id",
        "array",
        "no content",
        "result not an object",
        "202 to a request",
    ],
)
def test_it_fails_on_a_malformed_answer(response, problem):
    async def answer(seen):
        return response(seen)

    message, _ = failure_of(call_answered_with(answer))

    assert message == f"MCP tools/call 'lookup' failed: malformed response ({problem})"


def test_it_times_out_a_slow_server():
    async def answer(seen):
        await asyncio.sleep(5)
        return rpc_response(seen, result=text_result("too late"))

    message, _ = failure_of(call_answered_with(answer), timeout_ms=200)

    assert message.startswith("MCP tools/call 'lookup' failed: http://127.0.0.1:")
    assert message.endswith("timed out after 0.2s")


def test_it_fails_when_the_server_is_gone():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again before the call

    async def scenario():
        async with OutboundClient(allow_private=True) as outbound:
            executor = McpExecutor(
                outbound, "req-1", config(f"http://127.0.0.1:{port}/mcp", authorization=AUTHORIZATION)
            )
            with pytest.raises(ToolExecutionFailed) as failed:
                await executor.execute([tool_call()])
            return str(failed.value)

    message = asyncio.run(scenario())

    assert message.startswith(f"MCP initialize failed: http://127.0.0.1:{port}: could not connect")
    assert SECRET not in message


def test_it_fails_the_turn_when_one_of_its_calls_fails():
    async def answer(seen):
        if seen.message["params"]["name"] == "broken":
            return web.Response(status=500)
        return rpc_response(seen, result=text_result("ok"))

    message, _ = failure_of(call_answered_with(answer), [tool_call(), tool_call("broken", "{}", "call_0_1")])

    assert message == "MCP tools/call 'broken' failed: HTTP 500"


def test_it_refuses_a_blocked_address_without_allow_private():
    async def scenario():
        async with OutboundClient(allow_private=False) as outbound:
            executor = McpExecutor(outbound, "req-1", config("http://127.0.0.1:9/mcp"))
            with pytest.raises(ToolExecutionFailed) as failed:
                await executor.execute([tool_call()])
            return str(failed.value)

    message = asyncio.run(scenario())

    assert message == f"MCP initialize failed: http://127.0.0.1:9: {HOST_REFUSED}"
