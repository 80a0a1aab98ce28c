"""A cancel is honoured across engines: once the cancel's answer is back, no model call of the batch
leaves any engine (batches.engine.fence).

Found by the many-machines tier (tests/hosts): the engine that closes a batch cut every unfinished record
at once, but the other engines learnt of the cancel only at their next poll, and went on sending the
records they had claimed ahead until then (1 cancel in 5 across hosts; here, with four engines calling
fast, every time). Real clusters, the simulator's own clock for when each call came.
"""

import asyncio
import time

import pytest

from batches.engine.calls.caller import ModelCaller, Upstream
from batches.engine.fence import StatusFence
from batches.models import Record
from tests.helpers import CHAT, assert_exactly_once, chat, make_batch, status_of, wait_for

RECORDS = 600
LATENCY_MS = 500
CONCURRENCY = 48


@pytest.mark.slow
def test_no_model_call_leaves_after_the_cancel_answers(alice, model, fresh_sim, clusters):
    model.deployments.update(max_concurrency=CONCURRENCY)
    # Latencies spread over 300-700 ms: calls start all the time, not in waves a latency apart.
    latency = lambda i: LATENCY_MS - 200 + (i * 37) % 400  # noqa: E731
    batch = make_batch(alice.org, [chat(f"q{i} [[latency:{latency(i)}]]") for i in range(RECORDS)])
    # Two clusters of two engines: three engines that do not close batches, each with records claimed ahead.
    clusters()
    clusters()
    calls = lambda: fresh_sim.requests(CHAT)  # noqa: E731 - read again at each look
    wait_for(lambda: len(calls()) >= 3 * CONCURRENCY, 120, "the engines calling at full speed")
    engines = Record.objects.filter(batch=batch, status="running").values("lease_owner").distinct().count()
    assert engines >= 2, f"records running on {engines} engine(s): the test proves little"

    answered = alice.client.post(f"/v1/batches/{batch.public_id}/cancel")
    returned = time.monotonic()  # the simulator's clock: it runs in this process
    assert answered.status_code == 200, answered.content
    wait_for(lambda: status_of(batch) == "cancelled", 60, "the cancel to end")
    # Whatever an engine still held has gone out (or been cut) once none is in the model server.
    wait_for(lambda: fresh_sim.state.calls()["in_flight"] == 0, 60, "the calls in flight to end")

    late = [call for call in calls() if call["at"] > returned]
    assert not late, f"{len(late)} model calls left after the cancel answered (of {len(calls())})"
    out, err = assert_exactly_once(batch, RECORDS)
    assert out and {line["error"]["code"] for line in err} == {"batch_cancelled"}
    assert len(calls()) < RECORDS, "every record ran: the cancel came too late to prove anything"


def test_a_call_waits_for_a_read_of_the_batches_younger_than_the_window(sim):
    """The engine's side, alone: a call whose engine last read the running batches longer ago than the
    window asks for a poll and waits, holding its slot, until a read young enough; a read already too old
    when it lands lets nothing out."""
    now, asked = [100.0], []
    fence = StatusFence(lambda: asked.append(now[0]), window_s=0.75, clock=lambda: now[0])
    sent = lambda: [r["body"]["messages"][0]["content"] for r in sim.requests(CHAT)]  # noqa: E731

    async def until(predicate):
        for _ in range(1000):
            if predicate():
                return
            await asyncio.sleep(0)
        raise AssertionError("never")

    async def go():
        fence.read(99.5)
        async with ModelCaller([Upstream(sim.base_url, "m", "", 4)], time_limit_s=60, retries=0, fence=fence) as caller:
            assert (await caller.call(CHAT, chat("fresh"))).status_code == 200
            now[0] = 101.0  # the last read is 1.5 s old now
            waiting = asyncio.create_task(caller.call(CHAT, chat("after a fresh read")))
            await until(lambda: asked)
            fence.read(100.0)  # a read, but already a second old: still waiting, a poll asked again
            await until(lambda: len(asked) == 2)
            assert not waiting.done() and sent() == ["fresh"]
            fence.read(100.9)
            return await waiting

    assert asyncio.run(go()).status_code == 200
    assert sent() == ["fresh", "after a fresh read"]
