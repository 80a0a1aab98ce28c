"""The database trips: claims, flushes and checkpoint writes, on the engine's database thread.

One trip (`FlushAndClaim`) writes the finished records of every batch and
claims the next records of the batches whose claim-ahead ran low, in one
transaction (batches.engine.store.trip). The claimed records' input lines
are read beside the trip, after it, on the same thread (`read_lines`): a
retried trip (dbretry, a lost connection) never reads a file twice, and a
slow storage read never holds a transaction open.

A batch's big flush goes apart, to a thread and connection of its own
(batches.engine.apart), so the trips of the other batches go on meanwhile.

Checkpoints (a multi-step record's loop state) are group-committed by
`CheckpointWriter` through the same thread.
"""

import asyncio
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any, Protocol

from django.utils import timezone

from batches import tallies
from batches.engine import dbretry, prefixes, store
from batches.engine.apart import Apart, Holdings, Outcomes
from batches.engine.calls.budget import Holding
from batches.engine.checkpoints import LeaseLost
from batches.engine.config import EngineConfig
from batches.engine.fairness import OrgCaps
from batches.engine.spend import Guard
from batches.engine.store import ClaimedRecord
from files.models import File
from files.services import open_records

FLUSH_EVERY_S = 0.25
# The sent marks ahead (SentMarks): the records the model's calls here would start within AHEAD_S
# (its calls over the seconds a call holds one); slower than one in AHEAD_S, none are marked ahead.
AHEAD_S = 0.05
FLUSH_SIZE = 500
RECHECK_S = 1.0  # a batch with nothing left to claim looks again this often (dead engines' leases run out)


class Trips:
    """The Engine's trips to the database (a part of runner.Engine). It owns the trip's timing
    (`hop_s`), the count of records written (`worked`) and the answer bytes of the outcomes in
    flight (`flushing`); the batches it claims for and writes are handed to each call."""

    def __init__(
        self,
        owner: str,
        config: EngineConfig,
        db_thread: ThreadPoolExecutor,
        caps: OrgCaps,
        guard: Guard,
        wake: Callable[[], None],
    ) -> None:
        self.owner = owner  # whose leases the trips take and write under
        self.config = config
        self.db_thread = db_thread  # the one thread of every database trip
        self.caps = caps  # the organizations' caps (peers.Peers sets them)
        self.guard = guard
        self.hop_s = 0.0  # the database's round trip, smoothed
        self.worked = 0  # records this engine wrote
        self.flushing: list[Holding] = []  # the holdings of the outcomes the trip in flight writes
        self.apart = Apart(owner, config.lease_s, config.flush_apart_bytes, guard, wake)

    def due(self) -> bool:
        """Whether a trip is due for what a flush apart wrote (its batch may be finished)."""
        return self.apart.landed()

    def close(self) -> None:
        self.apart.shutdown()

    async def _flush_and_claim(self, runs, outcomes, claims):
        """(written {batch pk: n}, claimed {batch pk: [(ClaimedRecord, line bytes)]}, finished batch pks)."""
        trip = FlushAndClaim(self.owner, outcomes, claims, self.config.lease_s)
        return await asyncio.get_running_loop().run_in_executor(self.db_thread, self._trip_then_read, runs, trip)

    def _trip_then_read(self, runs, trip):
        written, records, finished = dbretry.call(trip)
        return written, read_lines(runs, records, self.config.prefix_bytes), finished

    def claims(self, now, runs):
        """{batch pk: (how many, after which line, how many of them may be records whose lease ran
        out)} for the batches (`runs`: {pk: BatchRun}) whose claim-ahead ran low.

        Records whose lease ran out (a dead engine's, sent) are claimed no more than this
        engine has calls free for them: after a take-over, its part of what the dead engines
        freed (`run.resume`, set by batch_set.Roster.take_over); else the calls free now. The
        other engines take the rest with theirs, so the records in flight go out again at once
        over every survivor, not one after another on the engine that found them (issue 55)."""
        claims = {}
        for run in runs.values():
            if not run.workable or run.recheck_at > now:
                continue
            lane = run.lane
            limit = self.caps.limits.get(run.organization_id)
            if lane.gate.capacity <= 0 or limit == 0:
                continue  # nothing to call it with here: other engines may take it
            run.adapt(now, self.hop_s)
            if len(run.queue) <= run.target // 2 or run.resume:
                limit = max(run.target - len(run.queue), run.resume)
                expired = 0
                if now >= run.expired_check_at:
                    run.expired_check_at = now + RECHECK_S
                    # After a take-over, its part; lapsed leases no take-over named (an engine row reaped):
                    # the whole claim-ahead, at the claim rate (a slot's worth a trip took 400 past 8 s).
                    expired = min(limit, run.resume) if run.resume else limit
                claims[run.pk] = (limit, run.cursor, expired)
        return claims

    async def trip(self, runs, claims, outcomes, holdings):
        """Flush `outcomes` (holding `holdings`), claim what `claims` asks for, queue what was claimed
        on `runs` ({pk: BatchRun}). Returns what the loop passes on (runner.Engine._pass_on):
        ({batch pk: written}, whether any record was claimed, the pks of the batches whose every
        record is now finished, the pks of the records to give back: their batch paused meanwhile)."""
        landed, landed_finished, outcomes, holdings = _joined(self.apart.collect(), outcomes, holdings)
        outcomes, flat = self.apart.split(outcomes, holdings)
        self.flushing += flat  # a trip that failed left its own: released with these
        started = time.monotonic()
        written, claimed, finished = await self._flush_and_claim(runs, outcomes, claims)
        self._release_flushed()
        await self.guard.flushed(outcomes)
        tallies.flushed(outcomes, written, claimed)
        self.hop_s = 0.7 * self.hop_s + 0.3 * (time.monotonic() - started)
        for pk, n in landed.items():
            written[pk] = written.get(pk, 0) + n
        finished |= landed_finished
        self.worked += sum(written.values())
        now = time.monotonic()
        handback = []
        for pk, (limit, _, _) in claims.items():
            run = runs.get(pk)
            if run is None:
                continue
            records = claimed.get(pk, [])
            if run.closing:
                continue  # closed while the claim ran: the closer marks these records
            if not run.workable:
                handback += [record.pk for record, _ in records]  # paused while the claim ran
                continue
            budgeted, run.resume = run.resume > 0, 0
            resumed = [item for item in records if item[0].resumed]
            run.resumed_queued += len(resumed)
            if resumed and run.queue:
                # A dead engine's records were in flight: they go first, not behind our claim-ahead,
                # and in line order with those it left that wait here already.
                waiting = list(run.queue)
                first = sorted([item for item in waiting if item[0].resumed] + resumed, key=lambda item: item[0].line)
                rest = [item for item in waiting if not item[0].resumed]
                fresh = [item for item in records if not item[0].resumed]
                run.queue = prefixes.RecordQueue([*first, *rest, *fresh], run.queue.marked)
            else:
                run.queue.extend(records)
            if not run.shared_prefixes and run.queue.shared():
                run.shared_prefixes = True
                run.target = max(run.target, self.config.prefix_window)  # claim the wider window at once
            # The cursor follows pending records only: a dead engine's record may lie past
            # pending lines that no one has claimed yet.
            pending_lines = [record.line for record, _ in records if not record.resumed]
            if pending_lines:
                run.cursor = max(run.cursor, pending_lines[-1])
            if len(pending_lines) < len(records) and not budgeted:
                # Leases that ran out without a take-over: more may be left; take them at the claim rate,
                # not one look a second (the 500 a kill -9 left took 30 s that way). After a
                # take-over the rest are the other survivors' part, and the others were told.
                run.expired_check_at = 0.0
            if len(records) < limit:
                run.recheck_at = now + RECHECK_S
        return written, bool(claimed), finished, handback

    async def flush_all(self, runs, outcomes, holdings):
        """Flush `outcomes` (the last trip, at shutdown), after the flushes apart end: what they held
        back goes with it. Returns the pks of the batches whose every record is now finished."""
        landed, finished, outcomes, holdings = _joined(await self.apart.drain(), outcomes, holdings)
        self.worked += sum(landed.values())
        if not outcomes:
            return finished
        self.flushing += [holding for held in holdings.values() for holding in held]
        written, _, flushed_finished = await self._flush_and_claim(runs, outcomes, {})
        self._release_flushed()
        await self.guard.flushed(outcomes)
        tallies.flushed(outcomes, written, {})
        self.worked += sum(written.values())
        return finished | flushed_finished

    def _release_flushed(self):
        """The flushed answers' bytes go back to the budget: calls waiting for room read on."""
        for holding in self.flushing:
            holding.release()
        self.flushing = []


def _joined(collected, outcomes: Outcomes, holdings: Holdings):
    """(written, finished) of the flushes apart that ended, and `outcomes` and `holdings` with what
    those held back put first (it finished earlier)."""
    written, finished, back, back_holdings = collected
    for pk, done in back.items():
        outcomes[pk] = done + outcomes.get(pk, [])
        holdings[pk] = back_holdings.get(pk, []) + holdings.get(pk, [])
    return written, finished, outcomes, holdings


class FlushAndClaim:
    """One flush-and-claim trip to the database, as dbretry calls it (again after a lost connection).

    Its lease time is fixed when the trip starts, so a retry can take back
    what an attempt whose answer was lost had leased already.
    """

    def __init__(self, owner, outcomes, claims, lease_s):
        self.owner, self.outcomes, self.claims = owner, outcomes, claims
        self.lease_until = timezone.now() + timedelta(seconds=lease_s)
        self.attempts = 0
        self.__name__ = "flush_and_claim"  # dbretry names the call it retries

    def __call__(self):
        self.attempts += 1
        return store.trip(self.owner, self.outcomes, self.claims, self.lease_until, recover=self.attempts > 1)


def read_lines(runs, records, prefix_bytes):
    """{batch pk: [(ClaimedRecord, its input line)]} for the records a trip claimed, each with its
    prompt prefix's key (batches.engine.prefixes). On the database thread, after the trip."""
    claimed: dict[int, list[tuple[ClaimedRecord, bytes]]] = {}
    for pk, batch_records in records.items():
        run = runs.get(pk)
        if run is None:
            continue
        if run.input is None:
            run.input = open_records(dbretry.call(_input_file, run.input_file_id))
        lines = claimed[pk] = []
        for record in batch_records:
            # In line order: the reads walk the file forward.
            run.input.seek(record.offset)
            line = run.input.read(record.length)
            record.prefix = prefixes.prefix_key(line, prefix_bytes)
            lines.append((record, line))
    return claimed


def _input_file(pk):
    return File.objects.get(pk=pk)


class CheckpointOwner(Protocol):
    """What a CheckpointWriter needs of its engine (runner.Engine), and all it may reach: whose
    leases the writes are conditional on, and the database thread they go through."""

    owner: str

    async def db(self, fn: Callable[..., Any], *args: Any) -> Any: ...


class GroupCommit:
    """Writes that waiters ask for one record at a time, group-committed: one drain task sends
    every record asked for meanwhile in one call of `write` ({record pk: value} -> the pks it
    wrote), and each waiter gets whether its record was written, or the group's error. A record
    asked for again before its group leaves is written once, with the newest value.

    What CheckpointWriter and SentMarks share: one statement on the database thread for the
    records a turn of the loop asks for, not one each."""

    def __init__(self, write: Callable[[dict[int, Any]], Awaitable[set[int]]]) -> None:
        self.write = write
        self.waiting: dict[int, list[Any]] = {}  # record pk -> [newest value, futures of its waiters]
        self.task: asyncio.Task[None] | None = None
        self.asked = 0  # groups asked for (each `waiting` that a first join opened) ...
        self.done = 0  # ... and settled: `behind` waits for the difference
        self.behind_waiters: list[tuple[int, asyncio.Future[None]]] = []

    async def join(self, pk: int, value: Any = None) -> bool:
        """Whether the record was written (False: the write found it no longer held)."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        if not self.waiting:
            self.asked += 1
        entry = self.waiting.get(pk)
        if entry is None:
            self.waiting[pk] = [value, [future]]
        else:
            entry[0] = value
            entry[1].append(future)
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._drain())
        return await future

    async def behind(self) -> None:
        """Return once every group asked for so far has settled (written or failed)."""
        if self.done >= self.asked:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.behind_waiters.append((self.asked, future))
        await asyncio.shield(future)

    async def _drain(self):
        try:
            while self.waiting:
                group, self.waiting = self.waiting, {}
                try:
                    held = await self.write({pk: value for pk, (value, _) in group.items()})
                except Exception as exc:  # noqa: BLE001 - every waiter of the group gets the error; the writer goes on
                    _settle(group, exc=exc)
                    self._settled(self.done + 1)
                    continue
                _settle(group, held=held)
                self._settled(self.done + 1)
        finally:
            self.task = None
            if not self.waiting:
                self._settled(self.asked)  # cancelled: nothing asked for is in flight any more

    def _settled(self, done):
        self.done = done
        waiting = []
        for target, future in self.behind_waiters:
            if target > done:
                waiting.append((target, future))
            elif not future.done():
                future.set_result(None)
        self.behind_waiters = waiting


class CheckpointWriter:
    """One engine's checkpoint writes (batches.engine.checkpoints), group-committed through its database thread."""

    def __init__(self, engine: CheckpointOwner) -> None:
        self.engine = engine
        self.group = GroupCommit(self._write)
        self.written = 0  # checkpoints written, and their bytes (the perf script reads these)
        self.bytes = 0

    async def save(self, pk, data):
        if not await self.group.join(pk, data):
            raise LeaseLost

    async def _write(self, states):
        held = await self.engine.db(store.save_checkpoints, self.engine.owner, states)
        self.written += len(states)
        self.bytes += sum(len(data) for data in states.values())
        return held


class SentMarks:
    """Records marked sent on their rows before their first model call (store.mark_sent),
    group-committed through the engine's database thread, and marked ahead.

    What a take-over needs to know of a dead engine's records, and deterministic: a record whose
    call went out is marked, because the mark landed before the call was made. Told by a
    heartbeat instead (what the engine named waiting or running 0.5 s before it died), a record
    started after the last one read as never sent, and went out again 16.9 s late (issue 55).

    Ahead (issue 55 item 4: a statement every ~10 records was a quarter to a third of the
    gateway's CPU a record): a record whose first call finds it unmarked asks, in the same
    statement, for the next records its batch's queue will start here (`_ahead`): as many as
    the engine's calls at the model start within AHEAD_S (Little's law: its calls over the
    seconds a call holds one, CallGate.call_s; none below 20 a second: slow calls, whose
    statements cost little, keep their marks exact), never more marked and queued than the
    engine's calls at the model (its gate's capacity). Not the batch's starts since its last
    statement: a slot round of slow calls starts together, a burst no rate. Those go out
    without a statement of their own, the mark having landed before.

    What that costs, bounded by those marked and never started (at most the engine's calls at
    the model, a batch): a take-over reads them as in flight and re-sends them first in line
    with the ones that were, and counts them in what it freed (a survivor's flow control
    absorbs that many calls, within its new part: peers.Peers.took_over); a host cut from the
    database may still call them until its leases fall into doubt (half a lease). They are
    called twice only in such a fault. The model's calls are counted where they go out
    (tallies.call), never from the marks.

    A dead engine's records (`resumed`) are never marked ahead: they go out in line order
    (fairness.first_in_line), which their own statements keep. While one of theirs waits for
    its statement, a record marked ahead waits for it too (`GroupCommit.behind`), so it never
    overtakes them on the way out: marks that landed sooner let 22-27 go before 8 and 9."""

    def __init__(self, engine: CheckpointOwner, ahead_s: float = AHEAD_S) -> None:
        self.engine = engine
        self.ahead_s = ahead_s
        self.group = GroupCommit(self._write)
        self.landing: dict[int, asyncio.Future[bool | None]] = {}  # marked ahead, the statement in flight
        self.queued_in: dict[int, set[int]] = {}  # the same records: their queue's `marked`
        self.first_in_line = 0  # resumed records waiting for their own statements

    async def mark(self, run: Any, record: ClaimedRecord) -> None:
        """Mark the record sent (or find it marked ahead); LeaseLost if it is no longer this
        engine's (fenced meanwhile). `run`: its lanes.BatchRun, whose queue it marks ahead in."""
        if record.ahead:
            record.ahead = False
            if self.first_in_line:
                await self.group.behind()
            return
        landing = self.landing.get(record.pk)
        if landing is not None:
            held = await asyncio.shield(landing)
            record.ahead = False
            if held:
                return
            if held is False:
                raise LeaseLost
            # None: the statement failed; the record asks for a mark of its own
        if record.resumed:
            self.first_in_line += 1
        try:
            held = await self.group.join(record.pk, self._ahead(run))
        finally:
            if record.resumed:
                self.first_in_line -= 1
        if not held:
            raise LeaseLost

    def _ahead(self, run: Any) -> list[ClaimedRecord]:
        """The records to mark ahead with this start's statement, in the order `run`'s queue
        starts them: as many as its model's calls here start within `ahead_s`, capped so the ones
        marked and waiting in its queue stay within the engine's calls at the model."""
        gate = run.lane.gate
        if not gate.call_s or gate.capacity * self.ahead_s < gate.call_s:
            return []  # not measured yet, or fewer than one start in `ahead_s`
        queue = run.queue
        marked = queue.marked
        want = min(int(gate.capacity * self.ahead_s / gate.call_s), gate.capacity - len(marked))
        picked: list[ClaimedRecord] = []
        if want <= 0:
            return picked
        for record, _ in queue:  # the marked ones mostly lead it: the walk stops early
            if not record.resumed and record.pk not in marked:
                picked.append(record)
                if len(picked) == want:
                    break
        loop = asyncio.get_running_loop()
        for record in picked:
            marked.add(record.pk)
            self.landing[record.pk] = loop.create_future()
            self.queued_in[record.pk] = marked
        return picked

    async def _write(self, marks):
        ahead = [record for records in marks.values() for record in records]
        try:
            held = await self.engine.db(store.mark_sent, self.engine.owner, [*marks, *(r.pk for r in ahead)])
        except BaseException:
            self._landed(ahead, None)
            raise
        self._landed(ahead, held)
        return held

    def _landed(self, ahead, held):
        for record in ahead:
            marked = None if held is None else record.pk in held
            record.ahead = bool(marked)
            queued_in = self.queued_in.pop(record.pk)
            if not marked:
                queued_in.discard(record.pk)  # not marked after all: it asks for a mark of its own
            self.landing.pop(record.pk).set_result(marked)


def _settle(batch, held=(), exc=None):
    for pk, (_, futures) in batch.items():
        for future in futures:
            if future.done():
                continue  # its record was cancelled meanwhile
            if exc is not None:
                future.set_exception(exc)
            else:
                future.set_result(pk in held)
