"""OutboundClient's slots: calls in flight per tenant and per host, taken before a call's clock starts.

A real aiohttp server on 127.0.0.1 in the test's own loop holds `/hold` calls
until the test lets them go and answers `/fast` at once; it counts what it
holds, so a limit is read where it matters, at the server.
"""

import asyncio
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from batches.engine.calls.caller import ModelCaller, Upstream
from batches.engine.context import RecordContext
from batches.engine.loops import workflow
from batches.engine.store import ClaimedRecord
from batches.engine.tools.executors import ToolExecutionFailed, make_executor
from openrelay.lib.outbound import OutboundClient, OutboundError
from tests.helpers import CHAT, MODEL, chat


@dataclass
class Holding:
    url: str
    release: asyncio.Event = field(default_factory=asyncio.Event)
    now: int = 0
    peak: int = 0
    seen: list = field(default_factory=list)  # the X-Call header of every request, as it came in


@asynccontextmanager
async def holding_server():
    state = Holding("")

    async def hold(request):
        state.seen.append(request.headers.get("X-Call"))
        state.now += 1
        state.peak = max(state.peak, state.now)
        try:
            await state.release.wait()
        finally:
            state.now -= 1
        return web.json_response({"held": True})

    async def fast(request):
        state.seen.append(request.headers.get("X-Call"))
        return web.json_response({"held": False})

    app = web.Application()
    app.router.add_post("/hold", hold)
    app.router.add_post("/fast", fast)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    state.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield state
    finally:
        state.release.set()
        await runner.cleanup()


async def until(predicate, what, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def post(client, url, call, *, tenant, timeout_s=10.0, **extra):
    return asyncio.ensure_future(
        client.post_json(url, {}, headers={"X-Call": call}, timeout_s=timeout_s, tenant=tenant, **extra)
    )


def test_it_keeps_a_tenant_to_its_slots_while_another_tenant_goes_on():
    async def scenario():
        async with holding_server() as server, OutboundClient(allow_private=True, per_tenant=2, per_host=50) as client:
            held = [post(client, f"{server.url}/hold", f"a{i}", tenant="org-a") for i in range(5)]
            await until(lambda: server.now == 2, "two of a's calls")
            # a's slots are full; b's call is sent and answered at once, to the same host.
            other = await client.post_json(f"{server.url}/fast", {}, headers={"X-Call": "b"}, timeout_s=10, tenant="b")
            assert other.json() == {"held": False}
            assert server.now == 2 and server.seen.count("b") == 1
            server.release.set()
            answers = await asyncio.gather(*held)
            return server.peak, [a.json() for a in answers], client.slots.tenants._semaphores

    peak, answers, left = asyncio.run(scenario())
    assert peak == 2
    assert answers == [{"held": True}] * 5  # the other three waited their turn
    assert left == {}  # a tenant with nothing in flight holds no semaphore


def test_it_keeps_a_host_to_its_connections_across_tenants():
    async def scenario():
        async with (
            holding_server() as busy,
            holding_server() as other,
            OutboundClient(allow_private=True, per_tenant=50, per_host=3) as client,
        ):
            held = [post(client, f"{busy.url}/hold", f"{t}{i}", tenant=t) for t in ("a", "b") for i in range(3)]
            await until(lambda: busy.now == 3, "three calls at the busy host")
            # Another host has connections of its own.
            answer = await client.post_json(f"{other.url}/fast", {}, timeout_s=10, tenant="a")
            assert answer.json() == {"held": False}
            busy.release.set()
            await asyncio.gather(*held)
            return busy.peak, len(busy.seen)

    assert asyncio.run(scenario()) == (3, 6)


def test_it_reports_a_slot_that_never_came_free_as_busy_and_sends_nothing():
    async def scenario():
        async with holding_server() as server, OutboundClient(allow_private=True, per_tenant=1) as client:
            first = post(client, f"{server.url}/hold", "first", tenant="org-a")
            await until(lambda: server.now == 1, "the first call")
            with pytest.raises(OutboundError) as caught:
                await client.post_json(
                    f"{server.url}/fast",
                    {},
                    headers={"X-Call": "second"},
                    timeout_s=30,
                    tenant="org-a",
                    slot_wait_s=0.2,
                )
            server.release.set()
            await first
            return caught.value, server.seen, server.url

    error, seen, url = asyncio.run(scenario())
    assert error.kind == "busy"
    assert error.message == (
        f"{url}: not sent: none of the organization's 1 outbound slots on this engine came free within 0.2s"
    )
    assert seen == ["first"]  # the second call never reached the server


def test_its_timeout_starts_when_the_call_is_sent_not_while_it_waits_for_a_slot():
    async def scenario():
        async with holding_server() as server, OutboundClient(allow_private=True, per_tenant=1) as client:
            first = post(client, f"{server.url}/hold", "first", tenant="org-a")
            await until(lambda: server.now == 1, "the first call")
            second = post(client, f"{server.url}/fast", "second", tenant="org-a", timeout_s=1.0)
            started = time.monotonic()
            # The second call waits for the first's slot for longer than its own timeout...
            await asyncio.sleep(1.5)
            assert not second.done()
            server.release.set()
            await first
            # ...and is answered in full once it is sent.
            return (await second).json(), time.monotonic() - started

    answer, waited = asyncio.run(scenario())
    assert answer == {"held": False} and waited > 1.0


def test_a_tool_executor_that_was_never_called_says_so_not_that_it_timed_out():
    """Through make_executor: the record's calls hold its organization's slots (7 here, the holder's too)."""
    tool_call = {"id": "call_0_0", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}

    async def scenario():
        async with (
            holding_server() as server,
            OutboundClient(allow_private=True, per_tenant=1, slot_wait_s=0.2) as client,
        ):
            first = post(client, f"{server.url}/hold", "first", tenant=7)
            await until(lambda: server.now == 1, "the first call")
            ctx = RecordContext(1, "batch_test", 7, "/v1/chat/completions", "sim-model", None, outbound=client)
            messages = []
            for kind in ("http", "mcp"):
                executor = make_executor(
                    ctx, "req-1", {"type": kind, "url": f"{server.url}/fast", "timeout_ms": 30_000}
                )
                with pytest.raises(ToolExecutionFailed) as caught:
                    await executor.execute([tool_call])
                messages.append(str(caught.value))
            server.release.set()
            await first
            return messages, server.seen, server.url

    (http, mcp), seen, url = asyncio.run(scenario())
    not_sent = f"{url}: not sent: none of the organization's 1 outbound slots on this engine came free within 0.2s"
    assert http == f"The tool executor was never called: {not_sent}."
    assert mcp == f"MCP initialize failed: {not_sent}"
    assert seen == ["first"]


def test_a_workflow_callback_holds_its_organizations_slots(sim):
    body = {**chat("Plan it."), "openrelay": {"workflow": {"url": "", "timeout_ms": 30_000}}}

    async def scenario():
        caller = ModelCaller([Upstream(sim.base_url, "sim-upstream", "", 8)], time_limit_s=10, retries=0)
        async with (
            holding_server() as server,
            caller,
            OutboundClient(allow_private=True, per_tenant=1, slot_wait_s=0.2) as client,
        ):
            first = post(client, f"{server.url}/hold", "first", tenant=7)
            await until(lambda: server.now == 1, "the first call")
            ctx = RecordContext(1, "batch_test", 7, CHAT, MODEL, caller, workflows_enabled=True, outbound=client)
            body["openrelay"]["workflow"]["url"] = f"{server.url}/fast"
            outcome = await workflow.run(ctx, ClaimedRecord(1, 1, "req-1", 0, 0), body)
            server.release.set()
            await first
            return outcome, server.seen, server.url

    outcome, seen, url = asyncio.run(scenario())
    assert (outcome.error_code, outcome.error_message) == (
        "workflow_callback_failed",
        f"The workflow callback failed after step 1: {url}: not sent: none of the organization's 1 outbound "
        "slots on this engine came free within 0.2s.",
    )
    assert seen == ["first"]
