"""Tool executors: what runs a model's tool calls between turns.

The tool loop (toolloop.py) owns rounds, usage and stripping; an executor only
turns one turn's tool calls into tool results. Two kinds, chosen by
`tool_config.type`: "http" (our plain POST protocol, http_executor.py) and
"mcp" (an MCP server over Streamable HTTP, mcp.py). Both send every request
through openrelay.lib.outbound (the guard for user-supplied URLs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.conf import settings

from batches.engine.tools.base import Executor, ToolExecutionFailed, ToolResult

__all__ = ["Executor", "ToolExecutionFailed", "ToolResult", "make_executor"]

if TYPE_CHECKING:
    from batches.engine.context import RecordContext


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
