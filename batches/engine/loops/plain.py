"""A plain record: one model call."""

from batches.engine.context import RecordContext
from batches.engine.outcomes import RecordOutcome, strip_openrelay


async def run(ctx: RecordContext, record, body):
    result = await ctx.caller.call(ctx.endpoint, strip_openrelay(body))
    return RecordOutcome.from_call(result)
