"""Which loop runs a record: plain call, tool-calling loop (chat or Anthropic Messages), or
workflow; and under which output contract (batches.engine.loops.contract), if any."""

from batches import endpoints
from batches.engine.checks import ContractTooCostly
from batches.engine.context import RecordContext
from batches.engine.loops import plain
from batches.engine.outcomes import RecordOutcome
from batches.validation.contracts import contract_for
from batches.validation.extensions import RecordRejected


async def run_record(ctx: RecordContext, record, body):
    try:
        return await _run(ctx, record, body)
    except ContractTooCostly as exc:  # its answer's check ran out of time: this record fails, alone
        return RecordOutcome.error(exc.code, str(exc))


async def _run(ctx, record, body):
    extension = body.get("openrelay") if isinstance(body, dict) else None
    if isinstance(extension, dict) and "workflow" in extension:
        from batches.engine.loops import workflow

        return await workflow.run(ctx, record, body)  # its requests carry their own contracts
    try:
        # Checked at create; again here because the batch's contract or the limits may be read anew.
        contract = contract_for(body, ctx.endpoint, ctx.output_contract) if isinstance(body, dict) else None
    except RecordRejected as exc:
        return RecordOutcome.error(exc.code, exc.message)
    if isinstance(extension, dict) and "tool_config" in extension:
        if endpoints.get(ctx.endpoint).tool_loop == "messages":  # tool_use blocks (message_tools.py)
            from batches.engine.loops import message_tools

            return await message_tools.run(ctx, record, body)
        from batches.engine.loops import toolloop

        return await toolloop.run(ctx, record, body, contract)
    if contract is not None:
        from batches.engine.loops import contract as contracted

        return await contracted.run(ctx, record, body, contract)
    return await plain.run(ctx, record, body)
