"""Workflow helpers: workflow bodies, and one workflow record run by hand against the simulator.

The callback server (`callback`, `Reply`) is shared: tests/fixtures/workflow_callback.py.
"""

import asyncio

from batches.engine.calls.caller import ModelCaller, Upstream
from batches.engine.context import RecordContext
from batches.engine.loops import workflow
from batches.engine.store import ClaimedRecord
from openrelay.lib.outbound import OutboundClient
from tests.helpers import MODEL, chat

ENDPOINT = "/v1/chat/completions"


def workflow_body(url, content="List the line items.", **workflow_fields):
    return {**chat(content), "openrelay": {"workflow": {"url": url, **workflow_fields}}}


def run_workflow(sim, body, *, custom_id="inv-0042", time_limit_s=5.0, allow_private=True, workflows_enabled=True):
    """Run one workflow record against the simulator, as the engine would; returns its RecordOutcome."""

    async def scenario():
        caller = ModelCaller([Upstream(sim.base_url, "sim-upstream", "", 8)], time_limit_s=time_limit_s, retries=0)
        async with caller, OutboundClient(allow_private=allow_private) as outbound:
            ctx = RecordContext(
                batch_pk=1,
                batch_public_id="batch_test",
                organization_id=1,
                endpoint=ENDPOINT,
                model_name=MODEL,
                caller=caller,
                workflows_enabled=workflows_enabled,
                outbound=outbound,
            )
            record = ClaimedRecord(pk=1, line=1, custom_id=custom_id, offset=0, length=0)
            return await workflow.run(ctx, record, body)

    return asyncio.run(scenario())
