"""The tool loop on a Messages record, driven alone: its checkpoints and a resume from one."""

import asyncio
from dataclasses import replace

import pytest

from batches.engine import checkpoints
from batches.engine.calls.caller import ModelCaller, Upstream
from batches.engine.context import RecordContext
from batches.engine.loops import dispatch
from batches.engine.store import ClaimedRecord
from openrelay.lib.outbound import OutboundClient

MESSAGES = "/v1/messages"
WEATHER = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


class Sink:
    """Where the loop's checkpoints go: kept as the engine stores them (encoded, then and there)."""

    def __init__(self, saved):
        self.saved = saved

    async def save(self, pk, data):
        self.saved.append(data)


def run(sim, executor, body, record, saved, messages_api):
    async def go():
        upstream = Upstream(sim.base_url, "sim-model", "", 8, messages_api=messages_api)
        caller = ModelCaller([upstream], time_limit_s=10.0, retries=0)
        async with caller, OutboundClient(allow_private=True) as outbound:
            ctx = RecordContext(
                1, "batch_test", 1, MESSAGES, "sim-model", caller, outbound=outbound, checkpoints=Sink(saved)
            )
            return await dispatch.run_record(ctx, record, body)

    return asyncio.run(go())


@pytest.mark.parametrize("messages_api", ["translate", "native"])
def test_a_resumed_record_runs_no_finished_step_again(sim, executor, messages_api):
    body = {
        "model": "sim-model",
        "max_tokens": 64,
        "tools": [WEATHER],
        "messages": [{"role": "user", "content": "Weather twice [[tool_rounds:2]]"}],
        "openrelay": {"tool_config": {"url": executor.url}},
    }
    record, saved = ClaimedRecord(1, 1, "w-1", 0, 0), []
    first = run(sim, executor, body, record, saved, messages_api)
    assert first.succeeded and first.body["content"][0]["text"].startswith("Final answer using:")
    assert first.body["openrelay"] == {"tool_rounds": 2}
    # A turn asking for tools, then the executor's round: two checkpoints a round.
    states = [checkpoints.decode(data) for data in saved]
    assert [(s["rounds"], s["pending"] is not None) for s in states] == [(0, True), (1, False), (1, True), (2, False)]
    assert states[1]["added"][1]["content"][0]["type"] == "tool_result"

    # Resume from the second turn's checkpoint: its tool_use runs on the executor, one model call follows.
    sim.reset()
    executor.reset()
    resumed = run(sim, executor, body, replace(record, checkpoint=saved[2]), [], messages_api)
    assert resumed.succeeded and resumed.body["openrelay"] == {"tool_rounds": 2}
    assert len(executor.received) == 1 and sim.request_count == 1
    assert resumed.usage == first.usage  # the checkpoint's turns are counted once, from the checkpoint
