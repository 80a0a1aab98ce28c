"""Fair shares: between engines (split), organizations and batches (CallGate, the engine's picks),
expedited before standard, organization caps, and tools that hang."""

import asyncio
import threading
import time

import pytest
from aiohttp import web
from django.db import connections

from batches.engine import fairness
from batches.engine.fairness import CallGate, OrgCaps, Ticket, split
from batches.engine.runner import Engine
from batches.models import Batch
from openrelay.simulator.config import SimulatorConfig
from openrelay.simulator.server import run_in_thread
from tests.fixtures.tool_executor import ExecutorServer, sleep
from tests.helpers import chat, make_batch, make_persona, status_of, wait_for


def test_split_adds_up_to_the_whole_and_differs_by_at_most_one():
    for total in (0, 1, 3, 16, 64, 65):
        for count in (1, 2, 3, 7):
            parts = [split(total, rank, count) for rank in range(count)]
            assert sum(parts) == total
            assert max(parts) - min(parts) <= 1
    assert split(1, 1, 2) == 0  # more engines than slots: some engines get none


class _Slot:
    def __init__(self, share):
        self.share = self.allotted = share  # not adaptive: no room past the limit
        self.in_use, self.healthy, self.express_from = 0, True, 0.0


def test_the_gate_serves_organizations_evenly_expedited_first_and_within_caps():
    async def scenario():
        caps = OrgCaps()
        gate = CallGate(caps)
        gate.upstreams = [_Slot(2)]
        a, b, urgent = Ticket(1, 100), Ticket(2, 200), Ticket(3, 300, expedited=True)
        held = [await gate.acquire(a), await gate.acquire(a)]  # a took the whole model
        order = []

        async def wait(ticket, name):
            upstream = await gate.acquire(ticket)
            order.append(name)
            return ticket, upstream

        waiters = [asyncio.create_task(wait(a, f"a{i}")) for i in range(3)]
        waiters += [asyncio.create_task(wait(b, f"b{i}")) for i in range(2)]
        waiters.append(asyncio.create_task(wait(urgent, "urgent")))
        await asyncio.sleep(0)
        assert gate.waiting == 6
        gate.release(a, held.pop())
        await asyncio.sleep(0)
        assert order == ["urgent"]  # expedited first, though a and b waited longer
        granted = {name: task for name, task in zip(["a0", "a1", "a2", "b0", "b1", "urgent"], waiters)}
        for name in ("urgent", "b0", "b1"):
            # a keeps a call in flight and b has none: every slot that comes free goes to b.
            gate.release(*granted[name].result())
            await asyncio.sleep(0)
        assert order == ["urgent", "b0", "b1", "a0"]  # b had nothing more waiting
        gate.release(a, held.pop())
        await asyncio.sleep(0)
        assert order == ["urgent", "b0", "b1", "a0", "a1"]
        for name in ("a0", "a1", "a2"):
            gate.release(*(await granted[name]))
        assert gate.in_use == 0 and gate.waiting == 0

        # An organization at its cap waits even when the model has room.
        caps.set_limits({100: 1})
        first = await gate.acquire(a)
        blocked = asyncio.create_task(gate.acquire(a))
        await asyncio.sleep(0)
        assert not blocked.done() and gate.free == 1 and gate.ready_waiting() == 0
        other = await gate.acquire(b)  # another organization is not held up
        gate.release(a, first)
        await asyncio.sleep(0)
        assert blocked.done()
        gate.release(a, blocked.result())
        gate.release(b, other)
        assert gate.in_use == 0 and not caps.calls

    asyncio.run(scenario())


def test_the_gate_puts_expedited_first_only_within_an_organizations_fair_share():
    async def scenario():
        gate = CallGate(OrgCaps())
        gate.upstreams = [_Slot(2)]
        urgent, plain, other = Ticket(1, 100, expedited=True), Ticket(2, 100), Ticket(3, 200)
        held = [await gate.acquire(urgent), await gate.acquire(urgent)]  # a's expedited batch took the model
        order = []

        async def wait(ticket, name):
            order.append((name, await gate.acquire(ticket)))

        waiters = [asyncio.create_task(wait(urgent, f"urgent{i}")) for i in range(3)]
        waiters += [asyncio.create_task(wait(plain, "plain")), asyncio.create_task(wait(other, "other"))]
        await asyncio.sleep(0)
        gate.release(urgent, held.pop())
        await asyncio.sleep(0)
        # Another organization's standard batch gets its share ahead of a's expedited ones ...
        assert [name for name, _ in order] == ["other"]
        gate.release(urgent, held.pop())
        await asyncio.sleep(0)
        # ... and within a's share, a's expedited batch goes before its standard one.
        assert [name for name, _ in order] == ["other", "urgent0"]
        for task in waiters:
            task.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)

    asyncio.run(scenario())


def test_organizations_tied_for_fewest_calls_take_turns():
    """Two organizations with nothing in flight, one slot between them (a deadline batch held the rest):
    each freed slot goes to the one served least recently. Ties went to the first in the gate's dicts,
    and org A sent 0 calls for 12 s while B took every slot (issue 55: test_deadlines, 36 vs 363)."""

    async def scenario():
        gate = CallGate(OrgCaps())
        gate.upstreams = [_Slot(1)]
        a, b = Ticket(1, 100), Ticket(2, 200)
        order = []

        async def wait(ticket, name):
            upstream = await gate.acquire(ticket)
            order.append(name)
            return ticket, upstream

        first = await gate.acquire(b)  # b is served first, so b's waiters enter the gate's dicts first
        granted = {f"b{i}": asyncio.create_task(wait(b, f"b{i}")) for i in range(3)}
        granted.update({f"a{i}": asyncio.create_task(wait(a, f"a{i}")) for i in range(3)})
        await asyncio.sleep(0)
        held = (b, first)
        for _ in range(6):
            gate.release(*held)
            await asyncio.sleep(0)
            held = granted[order[-1]].result()  # the one just granted holds the slot now
        gate.release(*held)
        assert order == ["a0", "b0", "a1", "b1", "a2", "b2"]
        assert gate.in_use == 0 and gate.waiting == 0

    asyncio.run(scenario())


def test_a_cancelled_waiter_gives_nothing_away():
    async def scenario():
        gate = CallGate(OrgCaps())
        gate.upstreams = [_Slot(1)]
        a = Ticket(1, 1)
        held = await gate.acquire(a)
        waiter = asyncio.create_task(gate.acquire(a))
        await asyncio.sleep(0)
        waiter.cancel()
        gate.release(a, held)  # the cancelled waiter must not take the slot
        await asyncio.gather(waiter, return_exceptions=True)
        assert gate.in_use == 0 and gate.waiting == 0

    asyncio.run(scenario())


# --- the engine, in this process -----------------------------------------------------------------


def _peak_tracking_simulator(latency_ms):
    sim = run_in_thread(SimulatorConfig(latency_ms=latency_ms, record=False))
    sim.now = sim.peak = 0

    @web.middleware
    async def track(request, handler):
        sim.now += 1
        sim.peak = max(sim.peak, sim.now)
        try:
            return await handler(request)
        finally:
            sim.now -= 1

    sim.app.middlewares.append(track)
    return sim


class Engines:
    """Engines running in threads of this process (as worker processes would), until stopped."""

    def __init__(self, count=1):
        self.engines = [Engine() for _ in range(count)]
        self.threads = [threading.Thread(target=self._run, args=(e,)) for e in self.engines]

    @staticmethod
    def _run(engine):
        try:
            asyncio.run(engine.run())
        finally:
            connections.close_all()

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        for engine in self.engines:
            engine.request_stop()
        for thread in self.threads:
            thread.join(timeout=30)
        assert not any(t.is_alive() for t in self.threads)


def _completed(batch):
    return Batch.objects.get(pk=batch.pk).completed_count


def test_a_model_shared_by_two_batches_and_two_engines_stays_within_its_concurrency(alice, model):
    with _peak_tracking_simulator(100) as sim:
        model.deployments.update(base_url=sim.base_url, max_concurrency=16)
        first = make_batch(alice.org, [chat(f"a{i}") for i in range(300)])
        second = make_batch(alice.org, [chat(f"b{i}") for i in range(300)])
        with Engines(2):
            wait_for(lambda: _completed(first) >= 64 and _completed(second) >= 64, 30, "both batches to run")
            assert sim.peak <= 16
            wait_for(lambda: {status_of(first), status_of(second)} == {"completed"}, 60, "both to complete")
        assert sim.peak == 16  # and the model was used to the full


def test_an_organization_cap_bounds_all_its_batches_together_across_engines(alice, model):
    alice.org.max_concurrency = 6
    alice.org.save(update_fields=["max_concurrency"])
    with _peak_tracking_simulator(100) as sim:
        model.deployments.update(base_url=sim.base_url, max_concurrency=64)
        batches = [make_batch(alice.org, [chat(f"{n}-{i}") for i in range(60)]) for n in range(2)]
        with Engines(2):
            wait_for(lambda: all(status_of(b) == "completed" for b in batches), 60, "the batches to complete")
    assert sim.peak == 6  # 3 + 3 over two engines; the model had room for 64


def test_another_organizations_small_batch_starts_at_once_behind_a_backlog(alice, model):
    bob = make_persona("bob-org")
    with run_in_thread(SimulatorConfig(latency_ms=200, record=False)) as sim:
        model.deployments.update(base_url=sim.base_url, max_concurrency=16)
        backlog = [make_batch(alice.org, [chat(f"a{n}-{i}") for i in range(400)]) for n in range(3)]
        with Engines(1):
            wait_for(lambda: sum(_completed(b) for b in backlog) >= 32, 30, "the backlog to fill the model")
            small = make_batch(bob.org, [chat(f"b{i}") for i in range(10)])
            took = wait_for(lambda: status_of(small) == "completed", 20, "the small batch")
            # Half the model is the small batch's at once: 10 records of 0.2 s are one round. The
            # bound leaves a loaded machine room; behind the backlog it would take ~15 s.
            assert took < 6, took
            assert all(status_of(b) == "in_progress" for b in backlog)
            # Alice's three batches shared her half round robin: none waited for another.
            counts = [_completed(b) for b in backlog]
            assert min(counts) > 0 and max(counts) - min(counts) <= 40, counts


def test_an_expedited_batch_goes_before_standard_ones(alice, model):
    with run_in_thread(SimulatorConfig(latency_ms=300, record=False)) as sim:
        model.deployments.update(base_url=sim.base_url, max_concurrency=8)
        standard = make_batch(alice.org, [chat(f"s{i}") for i in range(200)])
        with Engines(1):
            wait_for(lambda: _completed(standard) >= 8, 30, "the standard batch to fill the model")
            urgent = make_batch(alice.org, [chat(f"u{i}") for i in range(16)])
            Batch.objects.filter(pk=urgent.pk).update(priority="expedited")
            took = wait_for(lambda: status_of(urgent) == "completed", 20, "the expedited batch")
            # All 8 slots were the expedited batch's as they came free: two rounds of 0.3 s. The
            # bound leaves a loaded machine room; behind the standard batch it would take ~7 s.
            assert took < 5.0, took
            assert status_of(standard) == "in_progress"


def test_one_organizations_expedited_batches_leave_another_its_fair_share(alice, model):
    # The red team's case: A's expedited batches held B's standard batch to 29 s (expedited went
    # first across organizations). Now organizations share first, expedited goes first within one.
    bob = make_persona("bob-org")
    with run_in_thread(SimulatorConfig(latency_ms=200, record=False)) as sim:
        model.deployments.update(base_url=sim.base_url, max_concurrency=16)
        urgent = [make_batch(alice.org, [chat(f"a{n}-{i}") for i in range(400)]) for n in range(3)]
        Batch.objects.filter(pk__in=[b.pk for b in urgent]).update(priority="expedited")
        with Engines(1):
            wait_for(lambda: sum(_completed(b) for b in urgent) >= 32, 30, "the expedited batches to fill the model")
            standard = make_batch(bob.org, [chat(f"b{i}") for i in range(10)])
            took = wait_for(lambda: status_of(standard) == "completed", 30, "the other organization's batch")
            # Half the model is bob's at once: 10 records of 0.2 s are one round (alice's 1,200 take
            # 15 s); the bound leaves a loaded machine room.
            assert took < 6, took
            assert all(status_of(b) == "in_progress" for b in urgent)


@pytest.fixture
def hanging_executor(settings):
    settings.OPENRELAY_ALLOW_PRIVATE_URLS = True
    server = ExecutorServer().start()
    server.answer(sleep(8))
    yield server
    server.stop()


def test_hanging_tools_of_one_organization_do_not_slow_another(alice, model, hanging_executor, settings):
    settings.OPENRELAY_STOP_GRACE_S = 0.5  # the hanging records are handed back at the end
    bob = make_persona("bob-org")
    with run_in_thread(SimulatorConfig(latency_ms=20, record=False)) as sim:
        model.deployments.update(base_url=sim.base_url, max_concurrency=8)
        tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
        hanging = make_batch(
            alice.org,
            [
                {**chat(f"t{i}"), "tools": [tool], "openrelay": {"tool_config": {"url": hanging_executor.url}}}
                for i in range(200)
            ],
        )
        with Engines(1):
            wait_for(lambda: len(hanging_executor.received) >= 16, 20, "alice's records to wait on her tools")
            plain = make_batch(bob.org, [chat(f"b{i}") for i in range(40)])
            took = wait_for(lambda: status_of(plain) == "completed", 20, "bob's batch")
            assert took < 5, took  # behind alice's tools: 8 s; the bound leaves a loaded machine room
            assert _completed(hanging) == 0  # alice's records are all still waiting on her executor


def test_a_deadline_needs_the_calls_that_finish_it_by_half_its_window():
    from batches.engine.fairness import deadline_cap, deadline_need

    # 1,000 records left over 2 engines at 0.1 s a call, 40 s left of a 40 s window: 500 x 0.1 / 20 s.
    assert deadline_need(1000, 40, 40, 0.1, 2) == 3
    assert deadline_need(1000, 40, 86400, 0.1, 2) == 50  # past half its window: all it can get (a second)
    assert deadline_need(3000, 86000, 86400, 0.1, 2) == 0  # a 24 h batch: less than a call, no need
    assert deadline_need(1000, 40, 40, None, 2) == 0  # no measured pace yet
    assert (deadline_cap(4), deadline_cap(1), deadline_cap(0)) == (3, 1, 0)


class _Deployment:
    """A deployment as the gate sees it: the adaptive limit (`share`) under this engine's part of
    max_concurrency (`allotted`)."""

    def __init__(self, share, allotted):
        self.share, self.allotted, self.in_use, self.healthy = share, allotted, 0, True
        self.express_from = 0.0


def test_an_organizations_first_call_goes_past_the_adaptive_limit_held_by_anothers_slow_calls():
    """Issue 55 item 6 (bench row 15): org A's slow calls held the whole adaptive limit (4-9 of
    the engine's 32) and B's first call waited for one of them to end (15-60 s)."""

    async def scenario():
        gate = CallGate(OrgCaps())
        deployment = _Deployment(share=4, allotted=32)
        gate.upstreams = [deployment]
        a, b, c, d = Ticket(1, 100), Ticket(2, 200), Ticket(3, 300), Ticket(4, 400)
        slow = [await gate.acquire(a) for _ in range(4)]  # A's slow calls fill the limit; none ends
        a_more = asyncio.create_task(gate.acquire(a))
        await asyncio.sleep(0)
        assert not a_more.done()  # A, with calls in flight, waits within the limit as before

        b_first = await asyncio.wait_for(gate.acquire(b), 1)  # at once, before any of A's calls ends
        assert b_first is deployment
        b_second = asyncio.create_task(gate.acquire(b))
        await asyncio.sleep(0)
        assert not b_second.done()  # one call past the limit an organization, no more
        c_first = await asyncio.wait_for(gate.acquire(c), 1)
        d_first = asyncio.create_task(gate.acquire(d))
        await asyncio.sleep(0)
        assert not d_first.done()  # the calls past the limit are few (EXPRESS_CALLS)
        assert deployment.in_use - deployment.share == fairness.EXPRESS_CALLS == 2

        # The slots that free pay back the calls past the limit first, then go round robin as
        # before: the fewest calls first (D's first call came past the limit too).
        gate.release(a, slow.pop())
        await asyncio.sleep(0)
        assert d_first.done() and not b_second.done() and not a_more.done()
        gate.release(c, c_first)
        gate.release(a, slow.pop())
        await asyncio.sleep(0)
        assert deployment.in_use == deployment.share and not b_second.done()  # paid back, nothing more
        gate.release(d, d_first.result())
        await asyncio.sleep(0)
        assert b_second.done() and not a_more.done()  # B (1 call) before A (2 calls)
        assert deployment.in_use == deployment.share
        a_more.cancel()
        await asyncio.gather(a_more, return_exceptions=True)

    asyncio.run(scenario())


def test_no_call_goes_past_the_limit_while_a_batch_with_a_deadline_runs():
    """The slots that free pay calls past the limit back first, so each takes one from a batch with
    a deadline to meet: barred only while it was behind, others' first calls went past the limit
    each time it reached its part of the model (deadline_cap), and under load it expired (issue 55:
    test_deadlines)."""

    async def scenario():
        gate = CallGate(OrgCaps())
        deployment = _Deployment(share=4, allotted=32)
        gate.upstreams = [deployment]
        urgent, b, a = Ticket(1, 100), Ticket(2, 200), Ticket(3, 300)
        urgent.need = 8  # more than the model: it stays behind
        held = [await gate.acquire(urgent)] + [await gate.acquire(b) for _ in range(3)]
        more = [asyncio.create_task(gate.acquire(urgent)) for _ in range(3)]
        a_first = asyncio.create_task(gate.acquire(a))
        await asyncio.sleep(0)
        assert not a_first.done() and deployment.in_use == 4  # none past the limit meanwhile
        gate.release(b, held.pop())
        gate.release(b, held.pop())
        await asyncio.sleep(0)
        # The deadline's batch took the freed slots up to its part of the model (3 of 4), and A's
        # first call still waits within the limit.
        assert more[0].done() and more[1].done() and not a_first.done()
        assert deployment.in_use == 4
        gate.release(b, held.pop())
        await asyncio.sleep(0)
        assert a_first.done() and not more[2].done()  # past its part, the others go on: A first
        assert deployment.in_use == 4

        # No deadline left to meet: an organization's first call goes past the limit again.
        urgent.need = 0
        gate.release(urgent, more[0].result())  # a call of a batch without a need clears it
        await asyncio.sleep(0)
        assert more[2].done()
        c = Ticket(4, 400)
        c_first = await asyncio.wait_for(gate.acquire(c), 1)
        assert c_first is deployment and deployment.in_use == 5
        for task in (more[1], more[2]):
            gate.release(urgent, task.result())
        gate.release(a, a_first.result())
        gate.release(c, c_first)
        gate.release(urgent, held.pop())
        assert deployment.in_use == 0 and gate.waiting == 0

        # A deadline batch that ran out here while behind bars nothing once its last call ends.
        late = Ticket(5, 500)
        late.need = 8
        last = await gate.acquire(late)
        gate.release(late, last)
        assert not gate.deadlines
        held = [await gate.acquire(b) for _ in range(4)]
        d = Ticket(6, 600)
        d_first = await asyncio.wait_for(gate.acquire(d), 1)  # past the limit again
        assert deployment.in_use == 5
        gate.release(d, d_first)
        for upstream in held:
            gate.release(b, upstream)

    asyncio.run(scenario())


def test_no_call_goes_past_the_engines_part_of_max_concurrency_or_a_refusing_deployment():
    async def scenario():
        gate = CallGate(OrgCaps())
        full = _Deployment(share=4, allotted=4)  # the limit is the operator's ceiling: no room past it
        gate.upstreams = [full]
        a, b = Ticket(1, 100), Ticket(2, 200)
        held = [await gate.acquire(a) for _ in range(4)]
        waiter = asyncio.create_task(gate.acquire(b))
        await asyncio.sleep(0)
        assert not waiter.done() and full.in_use == 4
        gate.release(a, held.pop())
        await asyncio.sleep(0)
        assert waiter.done()

        refusing = _Deployment(share=4, allotted=32)
        refusing.express_from = time.monotonic() + 60  # it refused a call past the limit lately
        gate.upstreams = [refusing]
        held = [await gate.acquire(a) for _ in range(4)]
        waiter = asyncio.create_task(gate.acquire(Ticket(3, 300)))
        await asyncio.sleep(0)
        assert not waiter.done() and refusing.in_use == 4
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)

    asyncio.run(scenario())
