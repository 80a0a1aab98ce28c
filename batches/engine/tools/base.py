"""What every tool executor speaks: its result, its failure, its Protocol (executors.py picks one)."""

from dataclasses import dataclass
from typing import Any, Protocol


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
    async def execute(self, tool_calls: list[dict[str, Any]], key: str | None = None) -> list[ToolResult]:
        """Run one turn's tool calls (OpenAI `tool_calls` objects); one result per call, in order.

        `key` is the round's Idempotency-Key (the same whenever the round is sent again).
        """

    async def close(self) -> None:
        """Release anything held across rounds (an MCP session)."""
