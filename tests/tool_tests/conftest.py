"""Tool-loop fixtures: one record run by hand against the simulated model.

The tool executor (`executor`) and its answers are shared: tests/fixtures/tool_executor.py.
"""

import asyncio
from dataclasses import dataclass, field

import pytest

from batches.engine.calls.caller import ModelCaller, Upstream
from batches.engine.context import RecordContext
from batches.engine.store import ClaimedRecord
from openrelay.lib.outbound import OutboundClient

CHAT = "/v1/chat/completions"
SIM_MODEL = "sim-model"


# --- running one record by hand ---------------------------------------------------


class RecordingCaller(ModelCaller):
    """The real ModelCaller, keeping every CallResult so tests can sum usage themselves."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.results = []

    async def call(self, endpoint, body):
        result = await super().call(endpoint, body)
        self.results.append(result)
        return result


@dataclass
class Run:
    outcome: object
    model_results: list = field(default_factory=list)


def record_context(caller, outbound):
    return RecordContext(
        batch_pk=1,
        batch_public_id="batch_test",
        organization_id=1,
        endpoint=CHAT,
        model_name=SIM_MODEL,
        caller=caller,
        outbound=outbound,
    )


@pytest.fixture
def run_record(sim):
    """run_record(body, ...) -> Run: one record through `entry` (toolloop.run by default)."""

    def run(body, *, entry=None, time_limit_s=10.0, allow_private=True, custom_id="req-1"):
        if entry is None:
            from batches.engine.loops.toolloop import run as entry

        async def go():
            caller = RecordingCaller([Upstream(sim.base_url, SIM_MODEL, "", 8)], time_limit_s=time_limit_s, retries=0)
            async with caller, OutboundClient(allow_private=allow_private) as outbound:
                ctx = record_context(caller, outbound)
                outcome = await entry(ctx, ClaimedRecord(1, 1, custom_id, 0, 0), body)
            return Run(outcome, caller.results)

        return asyncio.run(go())

    return run
