"""Two engines on one deployment behind a proxy answering 500 for a dead upstream (issue 33, item 5):
what an engine counted of a run of 500s that another engine judged first. test_canary's cluster case
meets this interleaving only now and then (1 of 50 records written off in some runs); here it is
driven step by step, through each engine's own Health and the Deployment row between them."""

import asyncio
from types import SimpleNamespace

import pytest
from django.db import connections

from batches.engine import store
from batches.engine.calls.caller import POISON_FAILURES, CallResult, Upstream
from batches.engine.calls.health import Faults
from batches.engine.fairness import CallGate, OrgCaps
from batches.engine.runner import Engine
from openrelay.core.models import Deployment, Model

pytestmark = pytest.mark.django_db(transaction=True)

# Nothing listens there: the probes the ejections start fail quietly until the test ends.
DEAD_URL = "http://127.0.0.1:9/v1"


def _answer(status):
    return CallResult(kind="response", status_code=status, body={"error": {"message": "Connection error."}})


class Side:
    """One engine's view of the deployment: its Health, its gate and its Upstream."""

    def __init__(self, deployment):
        self.engine = Engine()
        self.engine.loop = asyncio.get_running_loop()
        self.gate = CallGate(OrgCaps())
        self.upstream = Upstream(deployment.base_url, "upstream", "", 16, deployment_id=deployment.pk)
        self.gate.upstreams = [self.upstream]
        self.lane = SimpleNamespace(gate=self.gate)
        self.model_id = deployment.model_id

    def answer(self, faults, status=500):
        """A call of the record whose Faults these are got `status`; why it is sent again, or ""."""
        return self.engine.peers.health.judge(self.gate, self.upstream, _answer(status), faults)

    def drop(self, faults):
        """A call of the record whose Faults these are was dropped (the connection reset under load)."""
        dropped = CallResult(kind="unavailable", message="The model server failed: the connection was reset.")
        return self.engine.peers.health.judge(self.gate, self.upstream, dropped, faults)

    async def settled(self):
        """Once the neutral request judging this engine's run is answered (the dead server refuses it)."""
        await self.engine.peers.health.settled(self.upstream)

    async def row(self):
        """The Deployment row once this engine's writes are in (one database thread: in order)."""
        await asyncio.sleep(0)
        rows = await self.engine.db(store.deployments, [self.model_id])
        return rows[self.model_id][0]

    async def read_row(self):
        """What a catalog refresh does with the row: adopt another engine's ejection."""
        self.engine.peers._adopt_health(self.lane, self.upstream, await self.row())

    async def close(self):
        await self.engine.peers.health.close()
        await self.engine.db(connections.close_all)
        self.engine.db_thread.shutdown()
        self.engine.closer.shutdown()
        self.upstream.close()


@pytest.fixture
def sides():
    """`sides(base_url)` makes two engines' views of one deployment at `base_url`."""

    def at(base_url=DEAD_URL):
        model = Model.objects.create(name="openrelay/peers")
        deployment = Deployment.objects.create(model=model, base_url=base_url, max_concurrency=16)

        async def make(count):
            return [Side(deployment) for _ in range(count)]

        return make

    return at


@pytest.fixture
def dead_proxy(model_proxy):
    """A LiteLLM-shaped proxy whose upstream is dead: 500 to every call and to the neutral request,
    while its /models answers 200 (so only a canary can tell when it serves again)."""
    return model_proxy(DEAD_URL.removesuffix("/v1"), error_delay_s=0.0)


def _run(sides, scenario, base_url=DEAD_URL):
    make = sides(base_url)

    async def main():
        made = await make(2)
        try:
            await scenario(*made)
        finally:
            for side in made:
                await side.close()

    asyncio.run(main())


def test_a_500_counted_before_a_peer_took_the_deployment_out_for_a_run_is_forgiven(sides):
    async def scenario(a, b):
        record = Faults()
        assert a.answer(record)  # sent again: one 500, not a run yet here
        assert record.count == 1 and a.upstream.healthy
        b.answer(Faults())
        b.answer(Faults())  # 500s to two records in a row on b, and the neutral request fails: the deployment's
        await b.settled()
        assert not b.upstream.healthy and b.upstream.canary  # out until a neutral request succeeds
        await b.row()  # b's write is in
        await a.read_row()
        assert not a.upstream.healthy
        assert record.count == 0, "the 500 was the deployment's, as b found"
        assert a.upstream.canary  # a waits for a canary of its own too
        # A call a sent before it read the row answers 500: the deployment's too.
        in_flight = Faults()
        assert a.answer(in_flight) and in_flight.count == 0
        assert record.count == 0 < POISON_FAILURES

    _run(sides, scenario)


def test_a_500_counted_before_a_peer_took_the_deployment_out_for_another_failure_still_counts(sides):
    """Out for a 503 (a failed server, probed back in), a record's lone 500 is its own, as with one engine."""

    async def scenario(a, b):
        record = Faults()
        a.answer(record)
        b.answer(Faults(), status=503)
        await b.settled()  # the neutral request fails too: out, probed back in
        assert not b.upstream.healthy and not b.upstream.canary
        await b.row()
        await a.read_row()
        assert not a.upstream.healthy and not a.upstream.canary
        assert record.count == 1
        a.answer(record)  # its call in flight answers 500 again: the record's
        assert record.count == 2

    _run(sides, scenario)


def test_an_engine_never_takes_its_own_change_for_a_peers(sides):
    async def scenario(a, _b):
        a.answer(Faults())
        a.answer(Faults())  # a run, and the neutral request fails: out until one succeeds, written to the row
        await a.settled()
        row = await a.row()
        assert (row["health"], row["needs_canary"]) == ("unhealthy", True)
        assert row["health_changed_at"] == a.upstream.health_seen_at  # exactly what a wrote
        # Back in the rotation before its own write of that reaches the row: the row's
        # ejection is a's own and older news, not a peer's.
        a.upstream.healthy, a.upstream.canary = True, False
        later = Faults()
        a.answer(later)
        await a.read_row()
        assert a.upstream.healthy and later.count == 1

    _run(sides, scenario)


def test_a_dropped_call_whose_neutral_request_draws_a_500_ejects_the_deployment_for_a_canary(sides, dead_proxy):
    """Issue 55, item 5: a call dropped under load began a run, the neutral request drew the proxy's
    500, and the deployment left without a canary: its /models answered 200 and put it back at once,
    and the 500s the records drew meanwhile (in flight, then re-sent) counted against them."""

    async def scenario(a, _b):
        a.drop(Faults())
        await a.settled()
        assert not a.upstream.healthy
        assert a.upstream.canary, "the server answers HTTP but fails: its /models can't vouch for it"
        in_flight = Faults()
        assert a.answer(in_flight)  # a record's call sent before it left answers 500: the deployment's
        assert in_flight.count == 0

    _run(sides, scenario, dead_proxy.base_url)


def test_a_500_counted_before_a_peer_took_the_deployment_out_for_a_dropped_call_is_forgiven(sides, dead_proxy):
    """The two-engine form of the above, as test_canary's cluster case met it: a's record drew a
    500 (not a run yet there) while b's dropped call took the deployment out."""

    async def scenario(a, b):
        record = Faults()
        a.answer(record)
        assert record.count == 1
        b.drop(Faults())
        await b.settled()
        assert not b.upstream.healthy and b.upstream.canary
        await b.row()
        await a.read_row()
        assert not a.upstream.healthy and a.upstream.canary
        assert record.count == 0, "the 500 was the deployment's, as b's neutral request found"
        a.answer(record)  # its call sent again before a read the row: the deployment's too
        assert record.count == 0

    _run(sides, scenario, dead_proxy.base_url)
