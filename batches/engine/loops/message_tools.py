"""A tool-calling Anthropic Messages record: the tool loop (toolloop.py) in Anthropic's shape.

A turn asks for tools with `tool_use` content blocks; the executor (the same http or MCP
executor chat records use) runs them as OpenAI tool calls, and its results go back as one user
turn of `tool_result` blocks. Rounds, checkpoints, Idempotency-Keys and billing are the tool
loop's own.
"""

import orjson

from batches.engine.loops import toolloop
from batches.engine.loops.toolloop import ToolLoop
from batches.engine.outcomes import RecordOutcome


async def run(ctx, record, body):
    return await toolloop.run(ctx, record, body, shape=MessageToolLoop)


class MessageToolLoop(ToolLoop):
    def requested(self, body, answer=True):
        content = body.get("content") if isinstance(body, dict) else None
        if not isinstance(content, list):
            return None, None
        # A turn is a tool round when it carries tool_use blocks, whatever its stop_reason says.
        uses = [
            b for b in content if isinstance(b, dict) and b.get("type") == "tool_use" and isinstance(b.get("id"), str)
        ]
        if not uses:
            return None, None
        return {"role": "assistant", "content": content}, [_as_tool_call(block) for block in uses]

    def round_messages(self, assistant, results):
        blocks = [{"type": "tool_result", "tool_use_id": r.tool_call_id, "content": r.content} for r in results]
        return [assistant, {"role": "user", "content": blocks}]

    def final(self, result, usage, rounds, reasks=0):  # contracts are for chat and responses only
        if not isinstance(result.body, dict):
            return RecordOutcome(True, result.status_code, result.request_id, result.body, usage=usage)
        body = {**result.body, "usage": message_usage(usage)}
        if rounds:
            body["openrelay"] = {"tool_rounds": rounds}
        return RecordOutcome(True, result.status_code, result.request_id, body, usage=usage)


def _as_tool_call(block):
    name, arguments = block.get("name"), block.get("input")
    return {
        "id": block["id"],
        "type": "function",
        "function": {
            "name": name if isinstance(name, str) else "",
            "arguments": orjson.dumps(arguments or {}).decode(),
        },
    }


def message_usage(usage):
    """Every turn's usage summed, as a Message reports it (cache writes were counted as input)."""
    return {
        "input_tokens": usage.prompt_tokens - usage.cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_tokens,
        "output_tokens": usage.completion_tokens,
        "service_tier": "batch",
    }
