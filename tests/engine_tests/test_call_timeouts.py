"""The call time limit is the engine's alone; a transport timeout is a failed server, not the limit."""

import asyncio

import aiohttp

from batches.engine.calls import ModelCaller, Upstream
from openrelay.simulator import SimulatorConfig, run_in_thread


def _run(coro):
    return asyncio.run(coro)


def test_the_session_does_not_cut_calls_at_aiohttps_five_minute_default():
    async def session_timeout():
        async with ModelCaller([Upstream("http://127.0.0.1:9/v1", "m", "", 4)], time_limit_s=1800, retries=0) as caller:
            return caller.session.timeout

    timeout = _run(session_timeout())
    assert timeout.total is None and timeout.sock_read is None


def test_the_call_limit_is_reported_as_the_limit():
    with run_in_thread(SimulatorConfig(latency_ms=500)) as sim:
        async def call():
            async with ModelCaller([Upstream(sim.base_url, "m", "", 4)], time_limit_s=0.1, retries=0) as caller:
                return await caller.call("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})

        result = _run(call())
    assert result.kind == "time_limit"


def test_a_connect_timeout_is_a_failed_server_and_is_retried(monkeypatch):
    attempts = []

    async def connect_times_out(self, url, payload, headers):
        attempts.append(url)
        raise aiohttp.ConnectionTimeoutError("connect timed out")

    monkeypatch.setattr(ModelCaller, "_send", connect_times_out)

    async def call():
        upstreams = [Upstream("http://127.0.0.1:9/v1", "m", "", 4)]
        async with ModelCaller(upstreams, time_limit_s=60, retries=1, backoff_base_s=0.01) as caller:
            return await caller.call("/v1/chat/completions", {"messages": []})

    result = _run(call())
    assert result.kind == "unavailable" and len(attempts) == 2
