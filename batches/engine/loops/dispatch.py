"""Which loop runs a record: plain call, tool-calling loop (chat or Anthropic Messages), or workflow."""

from batches.engine.context import RecordContext
from batches.engine.loops import plain

MESSAGES = "/v1/messages"  # Anthropic Messages records loop on tool_use blocks (message_tools.py)


async def run_record(ctx: RecordContext, record, body):
    extension = body.get("openrelay") if isinstance(body, dict) else None
    if isinstance(extension, dict) and "tool_config" in extension:
        if ctx.endpoint == MESSAGES:
            from batches.engine.loops import message_tools

            return await message_tools.run(ctx, record, body)
        from batches.engine.loops import toolloop

        return await toolloop.run(ctx, record, body)
    if isinstance(extension, dict) and "workflow" in extension:
        from batches.engine.loops import workflow

        return await workflow.run(ctx, record, body)
    return await plain.run(ctx, record, body)
