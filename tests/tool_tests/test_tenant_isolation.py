"""One organization's hanging tool servers cannot fail another organization's tool records.

Issue 42, finding 1, at small scale: organization A's MCP records ask for 16
parallel calls each on an official MCP server that never answers; organization
B's tool records on a healthy executor, run by the same engine, must still
succeed, and the executor must receive their calls. Before the per-organization
and per-host slots, A's calls filled the engine's one connection pool
(aiohttp's limit of 100) and B's calls waited for a connection inside their own
timeout_ms: "The tool executor timed out", with the executor never called.
"""

import threading
import time
from types import SimpleNamespace

import anyio
import pytest
import uvicorn
from mcp.server import MCPServer

from batches.models import Record
from tests.helpers import EngineThread, chat, make_batch, make_persona, status_of, succeeded, wait_for

LOOKUP_TOOL = {
    "type": "function",
    "function": {"name": "lookup", "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}},
}
A_RECORDS, A_CALLS = 10, 16  # 160 calls that never end, beside the old pool's 100 connections
B_RECORDS = 5


@pytest.fixture
def hanging_mcp():
    """The official MCP server (stateful, SSE answers) whose one tool never answers."""
    server = MCPServer("hanging", version="1.0")
    calls = []

    @server.tool()
    async def lookup(query: str) -> str:
        """Never answers."""
        calls.append(query)
        await anyio.sleep_forever()
        return "unreachable"

    config = uvicorn.Config(
        server.streamable_http_app(), host="127.0.0.1", port=0, log_level="warning", timeout_graceful_shutdown=1
    )
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    wait_for(lambda: uv.started or not thread.is_alive(), 10, "the MCP server to start")
    port = uv.servers[0].sockets[0].getsockname()[1]
    yield SimpleNamespace(url=f"http://127.0.0.1:{port}/mcp", calls=calls)
    uv.should_exit = True
    thread.join(timeout=10)


def tool_record(text, **tool_config):
    return chat(text, tools=[LOOKUP_TOOL], openrelay={"tool_config": tool_config})


def test_it_runs_another_organizations_tool_records_beside_hanging_mcp_servers(
    alice, model, settings, executor, hanging_mcp
):
    settings.OPENRELAY_ALLOW_PRIVATE_URLS = True  # both servers listen on 127.0.0.1
    settings.OPENRELAY_STOP_GRACE_S = 0.2  # A's hanging records are handed back at the end
    bob = make_persona("bob-org")
    hanging = tool_record(f"Look it up [[tool_calls:{A_CALLS}]]", type="mcp", url=hanging_mcp.url, timeout_ms=60_000)
    make_batch(alice.org, [hanging] * A_RECORDS)
    with EngineThread():
        # A's calls are in: every slot A may hold on this engine is taken by a call that never ends.
        wait_for(lambda: len(hanging_mcp.calls) >= settings.OPENRELAY_OUTBOUND_PER_ORGANIZATION, 30, "A's calls")
        healthy = make_batch(
            bob.org, [tool_record("Weather [[tool_calls:1]]", url=executor.url, timeout_ms=5000)] * B_RECORDS
        )
        started = time.monotonic()
        wait_for(lambda: status_of(healthy) == "completed", 60, "B's batch to complete")
        took = time.monotonic() - started
        # Every call of A's that started is still running: they never end, and A may hold no more.
        hanging = len(hanging_mcp.calls)
    errors = list(Record.objects.filter(batch=healthy).exclude(error_code="").values_list("error_message", flat=True))
    assert succeeded(healthy) == B_RECORDS, (took, errors, len(executor.received))
    assert sorted(r["json"]["custom_id"] for r in executor.received) == [f"req-{i}" for i in range(1, B_RECORDS + 1)]
    assert hanging == settings.OPENRELAY_OUTBOUND_PER_ORGANIZATION, hanging
