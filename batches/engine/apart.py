"""Big flushes, written apart: on a database thread and connection of their own.

Every trip (batches.engine.trips) runs on the engine's one database thread,
and the engine's loop waits for it. A flush of big answers held that thread
for seconds: 134 MB embeddings answers took several seconds a row, and every
other batch of the engine (other organizations' too) waited for them to be
claimed, called and written (issue 55, bench row 15: another organization's
20 records took 68.6 s). A flush whose batch holds OPENRELAY_FLUSH_APART_BYTES
of answers or more now goes to this thread instead, and the loop goes on.

While a batch's flush is apart, the batch's next outcomes wait here for it
(`held_back`): a trip that wrote them would wait for the batch row the apart
flush holds (store.lock_batches), and hold the loop up again. What an apart
flush wrote and finished reaches the loop at its next trip (`collect`); its
end wakes the loop, so a batch whose last records were big closes at once.
An apart flush that fails (past dbretry's outage limit) fails the next trip,
as a trip's own failure does: the engine starts again, and the records whose
outcomes were lost are run again once their leases run out.
"""

import asyncio
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from django.db import connection
from django.utils import timezone

from batches import tallies
from batches.engine import dbretry, store
from batches.engine.calls.budget import Holding
from batches.engine.spend import Guard

Outcomes = dict[int, list[Any]]  # {batch pk: [(ClaimedRecord, RecordOutcome)]}
Holdings = dict[int, list[Holding]]  # {batch pk: the answer bytes its outcomes hold}


class Apart:
    """One engine's flushes apart (a part of trips.Trips): the batches whose flush is in flight, the
    outcomes waiting for it, and what the finished ones wrote."""

    def __init__(self, owner: str, lease_s: float, threshold: int, guard: Guard, wake: Callable[[], None]) -> None:
        self.owner = owner
        self.lease_s = lease_s
        self.threshold = threshold  # a batch's answer bytes in one flush from which it goes apart (0: never)
        self.guard = guard
        self.wake = wake
        # Its own thread, so its own connection (Django's are per thread), with an engine session's deadlines.
        self.thread = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="openrelay-db-apart", initializer=dbretry.engine_session
        )
        self.flying: dict[int, asyncio.Task[tuple[int, bool]]] = {}
        self.held_back: dict[int, tuple[list[Any], list[Holding]]] = {}
        self.worked = 0  # records the apart flushes wrote

    def split(self, outcomes: Outcomes, holdings: Holdings) -> tuple[Outcomes, list[Holding]]:
        """Start the big flushes apart, hold back the outcomes of batches with one in flight, and
        return what the trip writes itself (its outcomes and their holdings)."""
        trip_outcomes: Outcomes = {}
        trip_holdings: list[Holding] = []
        for pk, done in outcomes.items():
            held = holdings.get(pk, [])
            if pk in self.flying:
                waiting, waiting_holdings = self.held_back.setdefault(pk, ([], []))
                waiting += done
                waiting_holdings += held
            elif self.threshold and sum(holding.size for holding in held) >= self.threshold:
                self._start(pk, done, held)
            else:
                trip_outcomes[pk] = done
                trip_holdings += held
        return trip_outcomes, trip_holdings

    def landed(self) -> bool:
        """Whether a flush apart ended since the last `collect`: the loop makes a trip to pass it on."""
        return any(task.done() for task in self.flying.values())

    def collect(self) -> tuple[dict[int, int], set[int], Outcomes, Holdings]:
        """What the ended flushes apart wrote ({batch pk: n}) and finished (batch pks), and the outcomes
        held back for them, which the trip now writes (or sends apart again). Raises the error of
        one that failed."""
        written: dict[int, int] = {}
        finished: set[int] = set()
        outcomes: Outcomes = {}
        holdings: Holdings = defaultdict(list)
        for pk, task in list(self.flying.items()):
            if not task.done():
                continue
            del self.flying[pk]
            if (waiting := self.held_back.pop(pk, None)) is not None:
                outcomes[pk], holdings[pk] = waiting
            n, batch_finished = task.result()
            written[pk] = n
            if batch_finished:
                finished.add(pk)
        return written, finished, outcomes, holdings

    async def drain(self) -> tuple[dict[int, int], set[int], Outcomes, Holdings]:
        """Wait for every flush apart (a stop): then `collect`."""
        await asyncio.gather(*self.flying.values(), return_exceptions=True)
        return self.collect()

    def shutdown(self) -> None:
        dbretry.shut(self.thread)  # its connection closed with it

    def _start(self, pk: int, done: list[Any], held: list[Holding]) -> None:
        task = asyncio.get_running_loop().create_task(self._flush(pk, done, held))
        task.add_done_callback(lambda _: self.wake())
        self.flying[pk] = task

    async def _flush(self, pk: int, done: list[Any], held: list[Holding]) -> tuple[int, bool]:
        outcomes = {pk: done}
        lease_until = timezone.now() + timedelta(seconds=self.lease_s)
        try:
            written, _, finished = await asyncio.get_running_loop().run_in_executor(
                self.thread, _trip_then_close, self.owner, outcomes, lease_until
            )
        finally:
            for holding in held:  # written or failed, the bytes go back: calls waiting for room read on
                holding.release()
        await self.guard.flushed(outcomes)
        tallies.flushed(outcomes, written, {})
        self.worked += written.get(pk, 0)
        return written.get(pk, 0), pk in finished


def _trip_then_close(owner: str, outcomes: Outcomes, lease_until: Any) -> Any:
    """The flush apart's trip; then its connection closes. libpq keeps the buffer of the largest
    message a connection sent until the connection closes, grown by doubling: 256 MB of a
    worker's memory after one 134 MB answer, for good (measured), on a thread that sends only
    big flushes. The next flush apart connects again (a few ms against seconds of writing)."""
    try:
        return dbretry.call(store.trip, owner, outcomes, {}, lease_until)
    finally:
        connection.close()
