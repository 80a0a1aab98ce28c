"""A model server that echoes the deployment's API key it received (whole, re-cased or a piece of
it) in an error body (JSON or not) or a header: no piece of it reaches what a record keeps (its
body, its message, its request id), as for the executor, MCP and workflow paths."""

import asyncio

import orjson
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batches.engine.calls.caller import ModelCaller, Upstream
from openrelay.simulator.server import AppThread
from tests.echoes import assert_no_piece, echoes

POSITIONS = ["json error", "nested json error", "text error", "header"]


class EchoingServer:
    """A model server on 127.0.0.1 answering every call from `answer(position, echoed)`."""

    def __init__(self):
        self.position, self.echoed = None, ""
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.handle)
        self.thread = AppThread(app, name="echoing-model")

    async def handle(self, request):
        echoed = self.echoed
        if self.position == "json error":
            return web.json_response({"error": {"message": f"invalid key {echoed}", "type": "auth"}}, status=400)
        if self.position == "nested json error":
            return web.json_response({"detail": [{"loc": ["header", echoed], "msg": echoed}]}, status=422)
        if self.position == "text error":
            return web.Response(text=f"<h1>400</h1><p>Bad key: {echoed}</p>", status=400)
        if self.position == "x-request-id":
            return web.json_response({"error": {"message": "no"}}, status=400, headers={"x-request-id": echoed})
        return web.json_response({"error": {"message": "no"}}, status=400, headers={"X-Echo": echoed})


@pytest.fixture(scope="module")
def server():
    echoing = EchoingServer()
    with echoing.thread:
        yield echoing


def _kept(server, api_key):
    async def go():
        upstream = Upstream(f"{server.thread.url}/v1", "m", api_key, 4)
        async with ModelCaller([upstream], time_limit_s=10, retries=0) as caller:
            result = await caller.call("/v1/chat/completions", {"messages": []})
        return [orjson.dumps(result.body).decode(), result.message, result.request_id, upstream.last_error]

    return asyncio.run(go())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(echoes(), st.sampled_from(POSITIONS))
def test_no_piece_of_the_key_comes_back_from_the_model_server(server, echo, position):
    authorization, token, echoed = echo
    server.position, server.echoed = position, echoed
    for text in _kept(server, token):
        assert_no_piece(text, authorization, token)


def test_an_echoed_key_in_x_request_id_stays_out_of_the_result():
    echoing = EchoingServer()
    token = "sk-upstream-0123456789abcdef"
    echoing.position, echoing.echoed = "x-request-id", token.upper()
    with echoing.thread:
        request_id = _kept(echoing, token)[2]
    assert_no_piece(request_id, token)
