"""An MCP server that echoes the Authorization value it received (whole, re-cased or a piece of it)
in a JSON-RPC error, an HTTP error body, a tool's text or a header: no piece of it, nor of the
session id, reaches the record's error message or the tool message the model reads."""

import asyncio

from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from batches.engine.tools.base import ToolExecutionFailed
from tests.echoes import assert_no_piece, echoes
from tests.mcp_tests.conftest import (
    SESSION,
    accepted,
    config,
    execute_rounds,
    init_result,
    rpc_response,
    scripted_server,
    text_result,
    tool_call,
)

POSITIONS = ["initialize error", "tools/call error", "http error body", "tool text", "sse error", "header"]


def _handler(position, echoed):
    async def handler(seen):
        if seen.rpc_method == "initialize":
            if position == "initialize error":
                return rpc_response(seen, error={"code": -32001, "message": f"unauthorized: {echoed}"})
            return rpc_response(seen, result=init_result(), headers={"Mcp-Session-Id": SESSION})
        if seen.rpc_method == "notifications/initialized":
            return accepted()
        if position == "tools/call error":
            return rpc_response(seen, error={"code": -32000, "message": "x" * 280 + f" refused {echoed}"})
        if position == "http error body":
            return rpc_response(seen, error={"code": -32600, "message": f"Bad Request: {echoed}"}, status=400)
        if position == "sse error":
            data = '{"jsonrpc": "2.0", "id": %d, "error": {"code": 1, "message": "%s"}}' % (seen.message["id"], echoed)  # noqa: UP031 - JSON
            return web.Response(body=f"event: message\ndata: {data}\n\n", content_type="text/event-stream")
        if position == "header":
            return rpc_response(seen, result={"nope": True}, headers={"X-Echo": echoed})
        return rpc_response(seen, result=text_result("first", f"the key: {echoed}"))

    return handler


def _texts(position, authorization, echoed):
    async def go():
        async with scripted_server(_handler(position, echoed)) as server:
            try:
                [results] = await execute_rounds(config(server.url, authorization=authorization), [tool_call()])
                return [result.content for result in results]
            except ToolExecutionFailed as exc:
                return [str(exc)]

    return asyncio.run(go())


def test_the_review_finding_the_token_upper_cased_and_its_last_20_characters():
    token = "mcp-SECRET-0123456789abcdefghij"
    for echoed in (token.upper(), token[-20:]):
        [message] = _texts("tools/call error", f"Bearer {token}", echoed)
        assert message.startswith("MCP tools/call 'lookup' failed: JSON-RPC error -32000: xxx")
        assert_no_piece(message, token)


@settings(max_examples=40, deadline=None)
@given(echoes(), st.sampled_from(POSITIONS))
def test_no_piece_of_the_credential_comes_back_from_the_mcp_server(echo, position):
    authorization, token, echoed = echo
    for text in _texts(position, authorization, echoed):
        assert_no_piece(text, authorization, token)


def test_the_session_id_is_a_secret_too():
    async def handler(seen):
        if seen.rpc_method == "initialize":
            return rpc_response(seen, result=init_result(), headers={"Mcp-Session-Id": SESSION})
        if seen.rpc_method == "notifications/initialized":
            return accepted()
        return rpc_response(seen, error={"code": 1, "message": f"session {SESSION.upper()} is gone"})

    async def go():
        async with scripted_server(handler) as server:
            await execute_rounds(config(server.url), [tool_call()])

    try:
        asyncio.run(go())
    except ToolExecutionFailed as exc:
        assert_no_piece(str(exc), SESSION)
    else:
        raise AssertionError("the call should fail")
