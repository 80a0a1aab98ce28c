"""A plain record: one model call."""

from batches.engine.calls import answer_text, messages
from batches.engine.context import RecordContext
from batches.engine.outcomes import RecordOutcome, strip_openrelay


async def run(ctx: RecordContext, record, body):
    # Its answer is only stored: a big one may stay JSON text (answer_text), but not an Anthropic
    # Message, which the caller reads to answer in the batch's dialect.
    wanted = answer_text.wanted.set(ctx.endpoint != messages.MESSAGES)
    try:
        result = await ctx.caller.call(ctx.endpoint, strip_openrelay(body))
    finally:
        answer_text.wanted.reset(wanted)
    return RecordOutcome.from_call(result)
