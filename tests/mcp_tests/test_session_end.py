"""The executor ends its MCP session with DELETE when the record's loop ends (spec: SHOULD)."""

import asyncio

import httpx
import pytest

from batches.engine.tools.base import ToolResult
from batches.engine.tools.mcp import ACCEPT, McpExecutor
from openrelay.lib.outbound import OutboundClient
from tests.fixtures.mcp_servers import AUTHORIZATION

from .conftest import (
    SESSION,
    config,
    execute_rounds,
    handshake_ok,
    rpc_response,
    run_rounds,
    scripted_server,
    text_result,
    tool_call,
)


async def answer_ok(seen):
    return await handshake_ok(seen) or rpc_response(seen, result=text_result("ok"))


def test_the_session_is_deleted_and_the_server_forgets_it(official_server):
    [results] = run_rounds(config(official_server.url), [tool_call()])

    assert results == [ToolResult("call_0_0", "found c-42")]
    session = official_server.seen[0].response_headers["mcp-session-id"]
    [delete] = official_server.deleted
    assert delete.headers["mcp-session-id"] == session and delete.status == 200
    assert delete.headers["mcp-protocol-version"] == "2025-06-18"
    # The server really let it go: the old id is now unknown.
    stale = httpx.post(
        official_server.url,
        json={"jsonrpc": "2.0", "id": 9, "method": "tools/list"},
        headers={"Mcp-Session-Id": session, "Accept": ACCEPT, "MCP-Protocol-Version": "2025-06-18"},
    )
    assert stale.status_code == 404


def test_the_delete_carries_the_authorization(auth_server):
    run_rounds(config(auth_server.url, authorization=AUTHORIZATION), [tool_call()])

    [delete] = auth_server.deleted
    assert delete.headers["authorization"] == AUTHORIZATION and delete.status == 200


def test_a_stateless_server_gets_no_delete(stateless_server):
    run_rounds(config(stateless_server.url), [tool_call()])

    assert stateless_server.deleted == []


def test_no_session_no_delete_when_the_record_never_called_a_tool(official_server):
    run_rounds(config(official_server.url))  # no rounds: the handshake never happened

    assert official_server.seen == [] and official_server.deleted == []


@pytest.mark.parametrize("delete_status", [200, 204, 404, 405, 500])
def test_any_answer_to_the_delete_leaves_the_results_alone(delete_status):
    async def scenario():
        async with scripted_server(answer_ok, delete_status=delete_status) as server:
            results = await execute_rounds(config(server.url, authorization=AUTHORIZATION), [tool_call()])
            return results, server.deleted

    [results], deleted = asyncio.run(scenario())
    assert results == [ToolResult("call_0_0", "ok")]
    [delete] = deleted
    assert delete.headers["mcp-session-id"] == SESSION and delete.headers["authorization"] == AUTHORIZATION


def test_a_server_gone_by_the_end_does_not_fail_the_close():
    async def scenario():
        async with OutboundClient(allow_private=True) as outbound:
            async with scripted_server(answer_ok) as server:
                executor = McpExecutor(outbound, "req-1", config(server.url))
                results = await executor.execute([tool_call()])
                assert executor.session_id == SESSION
            await executor.close()  # the server is gone: the DELETE fails, quietly
            return results, executor.session_id

    results, session = asyncio.run(scenario())
    assert results == [ToolResult("call_0_0", "ok")] and session is None
