"""What an engine holds, in one list: the state `runner.Engine.__init__` sets and its parts share.

`Engine` is made of four parts (batch_set.BatchSet, lanes.Lanes, peers.Peers,
trips.Trips), each in its own file; each is an `EngineState`, so a part reads
and changes the engine's state by these names and types, and calls another
part only through the methods declared here (mypy checks both).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from batches.engine.calls.budget import Budget, Holding
    from batches.engine.calls.caller import Upstream
    from batches.engine.calls.health import Health
    from batches.engine.checks import Checkers
    from batches.engine.config import EngineConfig
    from batches.engine.fairness import OrgCaps
    from batches.engine.lanes import BatchRun, Lane
    from batches.engine.leases import Leases
    from batches.engine.liveness import Liveness
    from batches.engine.spend import Guard
    from batches.engine.store import ClaimedRecord
    from batches.engine.trips import CheckpointWriter


class EngineState:
    config: EngineConfig
    owner: str  # host:pid:random, on the engine's row and its records' leases
    only: set[int] | None  # driven in-process: these batches only
    until_closed: bool
    poll_s: float
    poll_now: bool
    liveness: Liveness
    leases: Leases  # its renewals, on a thread of their own, and whether they still hold
    beaten: bool  # its first heartbeat creates its row; later ones find it (or were fenced)
    resuming: bool  # dead engines' records were freed: claim them before taking their shares
    freed: dict[int, int]  # batch pk -> records freed of a batch not joined yet
    db_thread: ThreadPoolExecutor  # the one thread of every database trip
    closer: ThreadPoolExecutor  # the thread that closes batches
    batches: dict[int, BatchRun]
    lanes: dict[int, Lane]  # model pk -> its lane
    caps: OrgCaps
    health: Health
    rank: int  # this engine's place among the live engines
    engines: int  # how many are live
    others_holding: dict[int, int]  # deployment pk -> calls the other live engines hold there
    running: dict[asyncio.Task[Any], tuple[BatchRun, ClaimedRecord]]  # slot task -> what it runs now
    handback: list[int]  # records to give back unfinished (stopping)
    closes: dict[int, asyncio.Task[Any]]  # batch pk -> the close running on the closer thread
    announcing: asyncio.Task[Any] | None  # the task sending live events, if one is
    stopping: bool
    stop_deadline: float | None
    hop_s: float  # the database's round trip, smoothed
    pending: int  # finished records waiting for a flush, over every batch
    flush_soon: bool  # a batch ran out of records here: write its last ones now
    newest_batch: int | None
    worked: int  # records this engine wrote
    loop: Any  # the engine's asyncio loop, once it runs
    wake: Any  # the Event that ends the loop's sleep, once it runs
    outbound: Any  # the engine's OutboundClient, once it runs
    checkpoints: CheckpointWriter
    answers: Budget
    checkers: Checkers  # output contracts' checker processes (checks.py)
    flushing: list[Holding]  # the holdings of the outcomes the trip in flight writes
    guard: Guard  # its guardrails: spend caps and budgets at the call seam, the error breaker

    # What one part calls of another (each defined in the part named).

    async def db(self, fn: Any, *args: Any) -> Any:  # runner
        raise NotImplementedError

    def _wake(self) -> None:  # runner
        raise NotImplementedError

    async def _open_lane(self, model_id: int) -> Lane:  # peers
        raise NotImplementedError

    def _health_changed(self, upstream: Upstream) -> None:  # peers
        raise NotImplementedError

    def _set_caps(self, rows: list[dict[str, Any]]) -> None:  # peers
        raise NotImplementedError

    def held(self, pk: int) -> None:  # batch_set
        raise NotImplementedError
