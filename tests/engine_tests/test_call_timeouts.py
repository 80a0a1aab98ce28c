"""The call time limit is the engine's alone; a transport timeout is a failed server, not the limit."""

import asyncio

from batches.engine.calls.caller import ModelCaller, Upstream
from openrelay.simulator.config import SimulatorConfig
from openrelay.simulator.server import run_in_thread


def _run(coro):
    return asyncio.run(coro)


def test_a_call_longer_than_any_transport_default_is_not_cut_below_the_limit():
    # aiohttp's session cut every call at 5 minutes and the engine reported the
    # 30-minute limit; the transport has no read timeout of its own, so only the
    # engine's limit ends a call. Scaled down: a 1.5 s answer under a 60 s limit.
    with run_in_thread(SimulatorConfig(latency_ms=1500)) as sim:

        async def call():
            async with ModelCaller([Upstream(sim.base_url, "m", "", 4)], time_limit_s=60, retries=0) as caller:
                return await caller.call("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})

        result = _run(call())
    assert result.ok, result


def test_the_call_limit_is_reported_as_the_limit():
    with run_in_thread(SimulatorConfig(latency_ms=500)) as sim:

        async def call():
            async with ModelCaller([Upstream(sim.base_url, "m", "", 4)], time_limit_s=0.1, retries=0) as caller:
                return await caller.call("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})

        result = _run(call())
    assert result.kind == "time_limit"


def test_a_connect_timeout_takes_the_deployment_out_and_the_call_waits_for_it(monkeypatch):
    attempts = []

    async def connect_times_out(self, upstream, head, payload):
        attempts.append(upstream.base_url)
        raise TimeoutError("connect timed out")

    monkeypatch.setattr(ModelCaller, "_send", connect_times_out)

    async def call():
        upstreams = [Upstream("http://127.0.0.1:9/v1", "m", "", 4)]
        async with ModelCaller(upstreams, time_limit_s=60, retries=1, backoff_base_s=0.01) as caller:
            waiting = asyncio.create_task(caller.call("/v1/chat/completions", {"messages": []}))
            await asyncio.sleep(0.5)  # the probes (port 9 refuses) keep it out all along
            state = waiting.done(), upstreams[0].healthy, upstreams[0].last_error
            waiting.cancel()
            return state

    done, healthy, last_error = _run(call())
    assert not done and not healthy and len(attempts) == 1
    assert "did not answer a probe" in last_error


def test_the_limit_cuts_a_call_soon_after_it_runs_out_and_leaves_the_task_usable():
    with run_in_thread(SimulatorConfig(latency_ms=5000)) as sim:

        async def call():
            async with ModelCaller([Upstream(sim.base_url, "m", "", 4)], time_limit_s=0.2, retries=0) as caller:
                started = asyncio.get_running_loop().time()
                result = await caller.call("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
                elapsed = asyncio.get_running_loop().time() - started
                # The cut is the call's alone: the task is not left cancelling.
                cancelling = asyncio.current_task().cancelling()
                await asyncio.sleep(0.01)
                return result, elapsed, cancelling

        result, elapsed, cancelling = _run(call())
    assert result.kind == "time_limit" and "0.2 seconds" in result.message
    # Cut at 0.2 s (the watchdog looks every 10 ms), not at the answer's 5 s; room for a loaded machine.
    assert 0.2 <= elapsed < 3.0
    assert cancelling == 0


def test_a_cancel_from_outside_is_not_reported_as_the_limit():
    with run_in_thread(SimulatorConfig(latency_ms=5000)) as sim:

        async def call():
            async with ModelCaller([Upstream(sim.base_url, "m", "", 4)], time_limit_s=60, retries=0) as caller:
                task = asyncio.create_task(
                    caller.call("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
                )
                await asyncio.sleep(0.2)
                task.cancel()  # the batch was cancelled
                try:
                    await task
                except asyncio.CancelledError:
                    return "cancelled", caller._deadlines
                return "returned", caller._deadlines

        outcome, in_flight = _run(call())
    assert outcome == "cancelled"
    assert in_flight == {}


def test_calls_within_the_limit_are_untouched_while_others_are_cut():
    with run_in_thread(SimulatorConfig()) as sim:

        async def calls():
            async with ModelCaller([Upstream(sim.base_url, "m", "", 8)], time_limit_s=0.3, retries=0) as caller:
                slow = caller.call(
                    "/v1/chat/completions", {"messages": [{"role": "user", "content": "[[latency:3000]]"}]}
                )
                fast = [
                    caller.call("/v1/chat/completions", {"messages": [{"role": "user", "content": f"hi {i}"}]})
                    for i in range(5)
                ]
                return await asyncio.gather(slow, *fast)

        slow, *fast = _run(calls())
    assert slow.kind == "time_limit"
    assert all(result.ok for result in fast)
