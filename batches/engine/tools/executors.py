"""Tool executors: what runs a model's tool calls between turns.

The tool loop (toolloop.py) owns rounds, usage and stripping; an executor only
turns one turn's tool calls into tool results. Two kinds, chosen by
`tool_config.type`: "http" (our plain POST protocol, http_executor.py) and
"mcp" (an MCP server over Streamable HTTP, mcp.py). Both send every request
through openrelay.lib.outbound (the guard for user-supplied URLs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from django.conf import settings

if TYPE_CHECKING:
    from batches.engine.context import RecordContext


class ToolExecutionFailed(Exception):
    """The executor failed; the record fails with code tool_execution_failed.

    The message goes into the error file, so it must never contain the
    authorization value or other header values.
    """


@dataclass(frozen=True)
class ToolResult:
    tool_call_id: str
    content: str


class Executor(Protocol):
    async def execute(self, tool_calls: list[dict], key: str | None = None) -> list[ToolResult]:
        """Run one turn's tool calls (OpenAI `tool_calls` objects); one result per call, in order.

        `key` is the round's Idempotency-Key (the same whenever the round is sent again).
        """

    async def close(self) -> None:
        """Release anything held across rounds (an MCP session)."""


def make_executor(ctx: RecordContext, custom_id, tool_config):
    """The executor for a record's normalized tool_config (one per record loop).

    Its calls hold the record's organization's outbound slots (openrelay.lib.outbound.Slots).
    """
    tenant = ctx.organization_id
    if tool_config.get("type", "http") == "mcp":
        from batches.engine.tools.mcp import McpExecutor

        parallel = settings.OPENRELAY_TOOL_PARALLEL_CALLS
        return McpExecutor(ctx.outbound, custom_id, tool_config, tenant=tenant, parallel=parallel)
    from batches.engine.tools.http_executor import HttpExecutor

    return HttpExecutor(ctx.outbound, custom_id, tool_config, tenant=tenant)
