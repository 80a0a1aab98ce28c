"""A tool executor that echoes the Authorization value it received (whole, re-cased or a piece of it)
in a tool_call_id, a result's content, an error body or a header: no piece of it reaches the
record's error message or the tool message the model reads."""

import asyncio

from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batches.engine.tools.base import ToolExecutionFailed
from batches.engine.tools.http_executor import HttpExecutor
from openrelay.lib.outbound import OutboundClient
from tests.echoes import assert_no_piece, echoes

CALLS = [
    {"id": "call_0_0", "type": "function", "function": {"name": "lookup", "arguments": "{}"}},
    {"id": "call_0_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}},
]


def _answer(position, echoed):
    async def answer(request, payload):
        if position == "unknown id":
            results = [{"tool_call_id": f"id-{echoed}", "content": "x"}]
        elif position == "content":
            results = [{"tool_call_id": c["id"], "content": f"the key was {echoed}!"} for c in payload["tool_calls"]]
        elif position == "json content":
            results = [{"tool_call_id": c["id"], "content": {"echo": [echoed]}} for c in payload["tool_calls"]]
        elif position == "error body":
            return web.json_response({"error": f"bad credentials: {echoed}"}, status=401)
        else:  # "header"
            return web.json_response({"results": "nope"}, headers={"X-Echo": echoed})
        return web.json_response({"results": results})

    return answer


def _execute(url, authorization):
    async def go():
        async with OutboundClient(allow_private=True) as outbound:
            executor = HttpExecutor(outbound, "req-1", {"url": url, "authorization": authorization, "timeout_ms": 5000})
            try:
                return [result.content for result in await executor.execute(CALLS, "key-1")]
            except ToolExecutionFailed as exc:
                return [str(exc)]

    return asyncio.run(go())


def test_the_review_finding_an_echoed_authorization_as_tool_call_id(executor):
    executor.answer(_answer("unknown id", "Bearer TOOLSECRET-0123456789abcdef"))
    [message] = _execute(executor.url, "Bearer TOOLSECRET-0123456789abcdef")
    assert message == "The tool executor's response is malformed: result 0 names unknown tool_call_id 'id-[redacted]'."


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(echoes(), st.sampled_from(["unknown id", "content", "json content", "error body", "header"]))
def test_no_piece_of_the_credential_comes_back_from_the_executor(executor, echo, position):
    authorization, token, echoed = echo
    executor.answer(_answer(position, echoed))
    for text in _execute(executor.url, authorization):
        assert_no_piece(text, authorization, token)
