"""The adaptive limit against a real server (the simulator's capacity model on 127.0.0.1): it backs
off on 503s from a full queue and on 429s, settles where latency says the slots are full, reads the
server's /metrics when there is one, and grows back once the pressure is gone."""

import asyncio

import pytest

from batches.engine.calls import ModelCaller, Upstream
from openrelay.simulator import SimulatorConfig, run_in_thread


def chat(text):
    return {"model": "m", "messages": [{"role": "user", "content": text}]}


async def drive(caller, bodies, callers):
    """`callers` coroutines send `bodies` through the caller, as an engine's slots do; the results in order."""
    results = [None] * len(bodies)
    todo = iter(enumerate(bodies))

    async def worker():
        for i, body in todo:
            results[i] = await caller.call("/v1/chat/completions", body)

    await asyncio.gather(*(worker() for _ in range(callers)))
    return results


def run(upstream, bodies, callers, retries=8):
    async def go():
        async with ModelCaller([upstream], time_limit_s=30, retries=retries) as caller:
            return await drive(caller, bodies, callers)

    return asyncio.run(go())


def capacity_server(**kw):
    return run_in_thread(SimulatorConfig(record=False, decode_ms_per_token=2.0, retry_after_s=0.05, **kw))


@pytest.fixture
def adaptive(settings):
    settings.OPENRELAY_ADAPTIVE_CONCURRENCY = True
    settings.OPENRELAY_CONCURRENCY_FLOOR = 1
    return settings


def test_503s_from_a_full_queue_cut_the_limit_and_every_call_still_succeeds(adaptive):
    adaptive.OPENRELAY_CONCURRENCY_START = 32
    with capacity_server(slots=4, queue_limit=4) as server:
        upstream = Upstream(server.base_url, "m", "", 64)
        results = run(upstream, [chat(f"q{i} [[tokens:10]]") for i in range(300)], callers=64)
        stats = server.stats()
    assert all(result.ok for result in results)
    assert stats["rejected"] > 0  # 32 in flight on 4 slots + 4 waiting: the server refused some
    assert upstream.share < 32 and upstream.healthy  # backed off, and an overload is not a dead server


def test_429s_cut_the_limit(adaptive):
    adaptive.OPENRELAY_CONCURRENCY_START = 32
    with run_in_thread(SimulatorConfig(record=False, latency_ms=5, error_rates={429: 0.3}, retry_after_s=0.01)) as server:
        upstream = Upstream(server.base_url, "m", "", 64)
        results = run(upstream, [chat(f"q{i}") for i in range(300)], callers=64, retries=50)
    assert all(result.ok for result in results)
    assert upstream.share < 16


def test_latency_climbing_holds_the_limit_near_the_servers_slots(adaptive):
    """4 slots, no queue limit: a fixed 64 would keep 60 requests queued in the server."""
    adaptive.OPENRELAY_CONCURRENCY_START = 2
    with capacity_server(slots=4) as server:
        upstream = Upstream(server.base_url, "m", "", 64)
        results = run(upstream, [chat(f"q{i} [[tokens:25]]") for i in range(600)], callers=64)
        stats = server.stats()
    assert all(result.ok for result in results)
    assert stats["max_running"] == 4
    assert 3 <= upstream.share <= 16, upstream.share
    assert stats["max_waiting"] < 30, stats


def test_the_servers_waiting_count_steers_the_limit_when_it_publishes_one(adaptive):
    adaptive.OPENRELAY_CONCURRENCY_START = 2
    with capacity_server(slots=4, metrics="vllm") as server:
        upstream = Upstream(server.base_url, "m", "", 64)
        results = run(upstream, [chat(f"q{i} [[tokens:25]]") for i in range(600)], callers=64)
        stats = server.stats()
    assert all(result.ok for result in results)
    assert upstream.flow.server is not None  # /metrics was read
    assert 3 <= upstream.share <= 16, upstream.share
    assert stats["max_waiting"] < 30, stats


def test_the_limit_grows_back_once_the_server_stops_pushing_back(adaptive):
    adaptive.OPENRELAY_CONCURRENCY_START = 16
    with run_in_thread(SimulatorConfig(record=False, latency_ms=20, retry_after_s=0.01)) as server:
        upstream = Upstream(server.base_url, "m", "", 32)
        run(upstream, [chat(f"busy {i} [[status:429x1]]") for i in range(64)], callers=32)
        cut = upstream.share
        assert cut < 16
        results = run(upstream, [chat(f"calm {i}") for i in range(1500)], callers=32)
    assert all(result.ok for result in results)
    assert upstream.share > cut + 8  # one more a full window, from the cut level
