"""Which loop runs a record: plain call, tool-calling loop, or workflow."""

from batches.engine.context import RecordContext
from batches.engine.loops import plain


async def run_record(ctx: RecordContext, record, body):
    extension = body.get("openrelay") if isinstance(body, dict) else None
    if isinstance(extension, dict) and "tool_config" in extension:
        from batches.engine.loops import toolloop

        return await toolloop.run(ctx, record, body)
    if isinstance(extension, dict) and "workflow" in extension:
        from batches.engine.loops import workflow

        return await workflow.run(ctx, record, body)
    return await plain.run(ctx, record, body)
