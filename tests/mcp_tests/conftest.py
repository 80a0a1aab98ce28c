"""Real MCP servers for the executor tests.

* `official_server` / `stateless_server` / `auth_server`: the official `mcp`
  package's MCPServer (2.x's name for FastMCP) over Streamable HTTP, served by
  uvicorn on 127.0.0.1 in a background thread (mcp-notes.md section 3). A
  small ASGI wrapper records what reached the server and what it answered.
* `scripted_server`: a hand-written aiohttp JSON-RPC server, for what the
  official server never does (404/405 on initialize, CRLF streams built by
  hand, malformed bodies, slow answers...). It runs inside the test's own
  event loop.

pytest-asyncio is not installed: scenarios run in asyncio.run.
"""

import asyncio
import json
import threading
import time
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest
import uvicorn
from aiohttp import web
from mcp.server import MCPServer
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError

from batches.engine.tools.mcp import McpExecutor
from openrelay.lib.outbound import OutboundClient

SECRET = "sk-mcp-very-secret-token"
AUTHORIZATION = f"Bearer {SECRET}"


# --- what a server saw -----------------------------------------------------


@dataclass
class Seen:
    """One HTTP request as the server received it (header names lower-case)."""

    method: str
    headers: dict
    message: object
    status: int | None = None
    response_headers: dict = field(default_factory=dict)
    response_body: bytes = b""

    @property
    def rpc_method(self):
        return self.message.get("method") if isinstance(self.message, dict) else None


def rpc_methods(seen):
    return [s.rpc_method for s in seen]


class Recorder:
    """ASGI wrapper: records each HTTP request and the status it got.

    JSON-RPC POSTs go to `seen`; the DELETEs that end sessions to `deleted`.
    """

    def __init__(self, app):
        self.app = app
        self.seen: list[Seen] = []
        self.deleted: list[Seen] = []

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        body = b""
        more = True
        while more:
            msg = await receive()
            body += msg.get("body", b"")
            more = msg.get("more_body", False)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        entry = Seen(scope["method"], headers, json.loads(body) if body else None)
        (self.deleted if scope["method"] == "DELETE" else self.seen).append(entry)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        async def record_send(msg):
            if msg["type"] == "http.response.start":
                entry.status = msg["status"]
                entry.response_headers = {
                    k.decode("latin-1").lower(): v.decode("latin-1") for k, v in msg.get("headers", [])
                }
            elif msg["type"] == "http.response.body":
                entry.response_body += msg.get("body", b"")
            await send(msg)

        await self.app(scope, replay, record_send)


# --- the official server ---------------------------------------------------


class StaticTokens:
    """A TokenVerifier that knows one token."""

    async def verify_token(self, token):
        if token == SECRET:
            return AccessToken(token=token, client_id="batch-worker", scopes=["tools"])
        return None


def build_mcp_server(*, auth=False):
    """An MCPServer with the tools the tests call; `received` logs raw arguments."""
    kwargs = {}
    if auth:
        kwargs = {
            "token_verifier": StaticTokens(),
            "auth": AuthSettings(
                issuer_url="http://127.0.0.1:1/issuer",
                resource_server_url=None,
                required_scopes=["tools"],
            ),
        }
    server = MCPServer("openrelay-test", version="1.0", **kwargs)
    received = []

    @server.tool()
    async def lookup(query: str, ctx: Context) -> str:
        """Look a contract up."""
        # MCPServer tools cannot declare `_context` (no leading underscore),
        # and validation drops it; the raw params still carry it.
        received.append(dict(ctx.request_context.params["arguments"]))
        return f"found {query}"

    @server.tool()
    async def chatty(ctx: Context) -> str:
        """Logs before answering, so the SSE stream carries a notification first."""
        await ctx.info("working on it")
        return "done talking"

    @server.tool()
    def pair() -> list[str]:
        """Two text content items."""
        return ["first", "second"]

    @server.tool()
    def refuse() -> str:
        """A tool error (isError: true)."""
        raise ToolError("contract is locked")

    return server, received


@dataclass
class OfficialServer:
    url: str
    recorder: Recorder
    received: list

    @property
    def seen(self):
        return self.recorder.seen

    @property
    def deleted(self):
        return self.recorder.deleted

    def reset(self):
        self.recorder.seen.clear()
        self.recorder.deleted.clear()
        self.received.clear()


def _serve_official(**app_options):
    auth = app_options.pop("auth", False)
    mcp, received = build_mcp_server(auth=auth)
    recorder = Recorder(mcp.streamable_http_app(**app_options))
    server = uvicorn.Server(uvicorn.Config(recorder, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    if not server.started:
        raise RuntimeError("the MCP server did not start")
    port = server.servers[0].sockets[0].getsockname()[1]
    return server, thread, OfficialServer(f"http://127.0.0.1:{port}/mcp", recorder, received)


def _official_fixture(**app_options):
    @pytest.fixture(scope="session")
    def running():
        server, thread, handle = _serve_official(**app_options)
        yield handle
        server.should_exit = True
        thread.join(timeout=5)

    return running


_official_stateful = _official_fixture()
_official_stateless = _official_fixture(stateless_http=True, json_response=True)
_official_auth = _official_fixture(auth=True)


@pytest.fixture
def official_server(_official_stateful):
    """Default mode: sessions and SSE responses."""
    _official_stateful.reset()
    return _official_stateful


@pytest.fixture
def stateless_server(_official_stateless):
    """stateless_http + json_response: no session id, plain JSON answers."""
    _official_stateless.reset()
    return _official_stateless


@pytest.fixture
def auth_server(_official_auth):
    """Stateful, and every request needs `Bearer SECRET` with scope tools."""
    _official_auth.reset()
    return _official_auth


# --- the hand-written server -----------------------------------------------


@dataclass
class ScriptedServer:
    url: str
    seen: list
    deleted: list  # DELETE /mcp requests (session ends), answered `delete_status`


Handler = Callable[[Seen], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def scripted_server(handler: Handler, delete_status: int = 200):
    """An aiohttp server on 127.0.0.1 whose POST /mcp answers are `handler`'s."""
    seen: list[Seen] = []
    deleted: list[Seen] = []

    async def end_session(request):
        deleted.append(Seen(request.method, {k.lower(): v for k, v in request.headers.items()}, None,
                            status=delete_status))
        return web.Response(status=delete_status)

    async def route(request):
        body = await request.read()
        entry = Seen(request.method, {k.lower(): v for k, v in request.headers.items()}, json.loads(body) if body else None)
        seen.append(entry)
        response = await handler(entry)
        entry.status = response.status
        return response

    app = web.Application()
    app.router.add_post("/mcp", route)
    app.router.add_delete("/mcp", end_session)
    # Handlers still running (a slow answer the client gave up on) are
    # cancelled at cleanup instead of being waited for.
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield ScriptedServer(f"http://127.0.0.1:{port}/mcp", seen, deleted)
    finally:
        await runner.cleanup()


def rpc_response(seen, *, result=None, error=None, status=200, headers=None):
    message = {"jsonrpc": "2.0", "id": seen.message.get("id")}
    message.update({"error": error} if error is not None else {"result": result})
    return web.json_response(message, status=status, headers=headers)


def sse_response(body, status=200):
    return web.Response(body=body.encode() if isinstance(body, str) else body, status=status, content_type="text/event-stream")


def accepted():
    return web.Response(status=202)


SESSION = "session-abc-123"


def init_result(version="2025-06-18"):
    return {"protocolVersion": version, "capabilities": {"tools": {}}, "serverInfo": {"name": "scripted", "version": "1"}}


async def handshake_ok(seen):
    """initialize -> JSON result with a session id; notifications -> 202."""
    if seen.rpc_method == "initialize":
        return rpc_response(seen, result=init_result(), headers={"Mcp-Session-Id": SESSION})
    if seen.rpc_method == "notifications/initialized":
        return accepted()
    return None


def text_result(*texts, is_error=False):
    return {"content": [{"type": "text", "text": t} for t in texts], "isError": is_error}


# --- running the executor --------------------------------------------------


def tool_call(name="lookup", arguments='{"query": "c-42"}', call_id="call_0_0"):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def config(url, **extra):
    return {"type": "mcp", "url": url, "max_rounds": 8, "timeout_ms": 5000, **extra}


async def execute_rounds(tool_config, *rounds):
    """Run each round's tool calls through one executor; the results per round."""
    async with OutboundClient(allow_private=True) as outbound:
        executor = McpExecutor(outbound, "req-1", tool_config)
        try:
            return [await executor.execute(calls) for calls in rounds]
        finally:
            await executor.close()


def run_rounds(tool_config, *rounds):
    return asyncio.run(execute_rounds(tool_config, *rounds))
