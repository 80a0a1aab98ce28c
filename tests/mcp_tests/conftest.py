"""MCP helpers for the executor tests: a hand-written server, and running the executor.

* `scripted_server`: a hand-written aiohttp JSON-RPC server, for what the
  official server never does (404/405 on initialize, CRLF streams built by
  hand, malformed bodies, slow answers...). It runs inside the test's own
  event loop.
* The official servers (`official_server`, `stateless_server`, `auth_server`)
  are shared: tests/fixtures/mcp_servers.py.

pytest-asyncio is not installed: scenarios run in asyncio.run.
"""

import asyncio
import json
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiohttp import web

from batches.engine.tools.mcp import McpExecutor
from openrelay.lib.outbound import OutboundClient
from tests.fixtures.mcp_servers import Seen

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
        deleted.append(
            Seen(request.method, {k.lower(): v for k, v in request.headers.items()}, None, status=delete_status)
        )
        return web.Response(status=delete_status)

    async def route(request):
        body = await request.read()
        entry = Seen(
            request.method, {k.lower(): v for k, v in request.headers.items()}, json.loads(body) if body else None
        )
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
    return web.Response(
        body=body.encode() if isinstance(body, str) else body, status=status, content_type="text/event-stream"
    )


def accepted():
    return web.Response(status=202)


SESSION = "session-abc-123"


def init_result(version="2025-06-18"):
    return {
        "protocolVersion": version,
        "capabilities": {"tools": {}},
        "serverInfo": {"name": "scripted", "version": "1"},
    }


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
