"""The engine: one per worker process, working records of every running batch at once.

The unit of scheduling is the record. Every engine (batches.engine.process
starts one in each django-q2 worker process) reads the running batches from
the database every POLL_S, claims records of each with short leases, and
runs them on one asyncio loop: one lane per model, whose slot coroutines
pick the next record fairly and whose CallGate hands out the model's call
slots in the same order (batches.engine.fairness). Results flush in bulk,
several batches a trip, on one database thread; batches are closed
(finalized, expired, cancelled) on a second one, so a close never holds up
claims.

The database is the ledger: a record is an engine's only while its lease
lives (renewed every OPENRELAY_LEASE_S / 4 on a thread of its own: batches.engine.leases;
an engine whose renewals stop landing for half a lease starts no record and
sends no call), every write
is conditional on still holding it, and a dead engine's records are
taken over by a live engine within about a second of its death
(batches.engine.liveness), by any engine once their lease runs out at worst.

`Engine` is this file's loop and its life (start, the loop's turn, stop,
shutdown); each other question has a room of its own, a part the Engine
holds, with its own state (docs/engine.md has the map):

- batch_set.py, `roster`: which batches run here; joining, dropping and
  closing them;
- lanes.py, `lanes`: which record starts (the slot coroutines, the outcomes
  waiting for a flush);
- peers.py, `peers`: what this engine holds among the others (heartbeat,
  shares, the models' lanes, deployments and their health);
- trips.py, `trips`: the database trips (claims, flushes, checkpoint writes).

The parts never reach into each other: `_main` takes what one returns (a
trip's written, claimed and finished batches, the records to give back,
what dead engines freed) to the one that acts on it.
"""

import asyncio
import logging
import os
import secrets
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.db import connections
from django.utils import timezone

from batches import tallies
from batches.engine import checks, dbretry, fairness, leases, liveness, spend, store, warmup
from batches.engine.batch_set import Roster
from batches.engine.calls import budget
from batches.engine.config import EngineConfig
from batches.engine.fence import StatusFence
from batches.engine.lanes import BatchRun, Lanes
from batches.engine.peers import DEPLOYMENTS_EVERY_S, HEARTBEAT_S, Peers
from batches.engine.trips import FLUSH_EVERY_S, CheckpointWriter, SentMarks, Trips
from openrelay.lib.outbound import OutboundClient

logger = logging.getLogger("openrelay.engine")

POLL_S = 0.2  # how often the engine reads the running batches
# How often it looks for a new batch (one primary-key lookup): a new batch's first
# call waited for the next poll and then a loop's sleep, 0.17-0.45 s on an idle cluster.
WATCH_S = 0.05


class Engine:
    """Works every running batch (or, driven in-process, the batches in `only`).

    It holds four parts, each with its own state: `roster` (the batches), `lanes` (the slots
    that run their records), `peers` (the other engines, the models' lanes and deployments) and
    `trips` (the database trips). No part reads another's: `_main` asks one for what it knows
    and hands that to the one that acts on it. The engine itself keeps its life (the loop, its
    threads, stopping) and the seams the parts are handed (`db`, `_wake`, `_open_run`).
    """

    def __init__(self, only=None, until_closed=False, stop_heard=None):
        self.config = EngineConfig.read()
        # Whether its process's cluster is stopping (process.cluster_stopping), read at each watch.
        self.stop_heard = stop_heard
        self.only = set(only) if only is not None else None
        self.until_closed = until_closed
        # An in-process engine watches a few batches: it may look often (tests wait on it).
        self.poll_s = POLL_S if only is None else POLL_S / 4
        self.poll_now = False
        self.beat_now = False  # an engine left (the watch saw their count fall): beat now, not in 0.5 s
        self.engine_count = None  # the engines' rows, as the watch last counted them
        self.refused_seen = None  # the other engines' latest refusal, as the watch last read it
        self.owner = f"{socket.gethostname()[:30]}:{os.getpid()}:{secrets.token_hex(4)}"
        self.liveness = liveness.Liveness(self.owner)
        self.leases = leases.Leases(self.owner, self.config.lease_s)
        # An engine session: the server ends what it leaves open (dbretry.deadlines).
        self.db_thread = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="openrelay-db", initializer=dbretry.engine_session
        )
        self.closer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="openrelay-close")
        self.handback: list[int] = []  # what the parts gave back, released at the loop's next turn
        self.stopping = False
        self.stop_deadline = 0.0
        self.newest_batch = None
        self.loop: Any = None  # the engine's asyncio loop, once it runs
        self.wake: Any = None  # the Event that ends the loop's sleep, once it runs
        self.outbound: Any = None  # the engine's OutboundClient, once it runs
        self.checkpoints = CheckpointWriter(self)
        self.checkers = checks.Checkers(
            self.config.contract_checkers,
            self.config.contract_check_time_limit_s,
            self.config.contract_check_memory_bytes,
        )
        self.guard = spend.Guard(self)
        caps = fairness.OrgCaps()
        self.fence = StatusFence(self._poll_soon)
        self.peers = Peers(
            self.config, self.owner, self.liveness, caps, self.db, self._wake, self.leases.live, self.fence
        )
        self.lanes = Lanes(
            caps,
            self.guard,
            budget.Budget(self.config.answer_budget_bytes),
            self._wake,
            self.leases.live,
            SentMarks(self),
        )
        self.roster = Roster(
            self.only,
            self.guard,
            self.db,
            (self.db_thread, self.closer),
            open_run=self._open_run,
            cancel=self.lanes.cancel,
            closes_batches=self._closes_batches,
            wake=self._wake,
            poll_soon=self._poll_soon,
        )
        self.trips = Trips(self.owner, self.config, self.db_thread, caps, self.guard, self._wake)

    # ------------------------------------------------------------ life

    def request_stop(self):
        """Stop cleanly (callable from any thread): stop claiming, hand back what has not
        started, let calls in flight finish within OPENRELAY_STOP_GRACE_S, hand back the rest."""
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._begin_stop)

    async def db(self, fn, *args):
        # dbretry: a database restart costs a pause, not the engine.
        return await asyncio.get_running_loop().run_in_executor(self.db_thread, dbretry.call, fn, *args)

    async def run(self):
        self.loop = asyncio.get_running_loop()
        self.wake = asyncio.Event()
        try:
            async with OutboundClient() as self.outbound:
                watch = self.loop.create_task(self._watch())
                tend = None
                try:
                    if self.only is None:  # a worker's engine (not one driven in-process for given batches)
                        await warmup.warm()
                    await self._heartbeat()
                    self.leases.start()
                    tend = self.loop.create_task(self._tend_leases())
                    await self._poll()
                    await self._main()
                finally:
                    watch.cancel()
                    await asyncio.gather(watch, return_exceptions=True)
                    await self._shutdown()
                    if tend is not None:
                        tend.cancel()
                        await asyncio.gather(tend, return_exceptions=True)
        finally:
            self.leases.stop()
            self.trips.close()
            dbretry.shut(self.db_thread)
            dbretry.shut(self.closer)
            self.liveness.close()  # here too: a shutdown cut short by the database never reaches _cleanup
        return self.trips.worked

    async def _main(self):
        now = time.monotonic()
        last_poll = last_flush = last_beat = last_deployments = now
        while True:
            now = time.monotonic()
            if self.leases.fenced:
                logger.error("engine %s was taken for dead and its records taken over; starting again", self.owner)
                raise store.Fenced(self.owner)
            if self.stopping:
                self.lanes.cancel_stuck(now, self.stop_deadline)
                if not self.lanes.running:
                    break
            else:
                self.lanes.start_slots(self.peers.lanes.values())
            # None while the leases are in doubt (leases.py): it would start none of them.
            claims = {} if self.stopping or not self.leases.live() else self.trips.claims(now, self.roster.batches)
            if claims or self.lanes.flush_due(now, last_flush) or self.trips.due():
                await self._pass_on(*await self._trip(claims))
                last_flush = now
            self.handback += self.roster.take_handback() + self.lanes.take_handback()
            if self.handback:
                pks, self.handback = self.handback, []
                await self.db(store.release, self.owner, pks)
            if self.poll_now or now - last_poll >= self.poll_s:
                last_poll, self.poll_now = now, False
                await self._poll()
                if self.until_closed and self._nothing_to_do():
                    break
            if self.beat_now or now - last_beat >= HEARTBEAT_S:
                last_beat, self.beat_now = now, False
                await self._heartbeat()
            if self.peers.resuming:
                await self._take_over()
            if self.peers.tell_refusals or self.peers.hear_refusals:
                await self.peers.share_refusals()
            if now - last_deployments >= DEPLOYMENTS_EVERY_S:
                last_deployments = now
                await self.peers.refresh_deployments()
            await self._sleep(FLUSH_EVERY_S)

    async def _tend_leases(self):
        """Tell the renewing thread that the loop turns and which batches it holds; while the
        renewals do not land (the database is cut off, or the process was stopped), drop the
        records claimed ahead: they go back, or their leases run out, for other engines."""
        every = min(0.25, self.config.lease_s / 8)
        in_doubt = False
        while True:
            await asyncio.sleep(every)
            self.leases.loop_seen = time.monotonic()
            self.leases.batch_pks = list(self.roster.batches)
            if self.leases.live():
                if in_doubt:
                    logger.info("engine %s renews its leases again", self.owner)
                    in_doubt = False
                    self._wake()
                continue
            if not in_doubt:
                logger.warning(
                    "engine %s: no renewal of its leases for half a lease; it starts no call (%d in flight)",
                    self.owner,
                    len(self.lanes.running),
                )
                in_doubt = True
            for run in self.roster.batches.values():
                self.handback += run.hand_back()
            self._wake()

    async def _trip(self, claims):
        """One trip: the lanes' finished outcomes written, `claims` claimed for the roster's batches."""
        runs = self.roster.batches
        return await self.trips.trip(runs, claims, *self.lanes.take_outcomes(runs.values()))

    async def _pass_on(self, written, claimed, finished, handback):
        """What a trip wrote, claimed, finished and gave back goes to the parts that act on it: the lanes
        start the claimed records, the roster closes the finished batches and announces the written ones,
        the loop gives back the rest at its next turn."""
        self.handback += handback
        if claimed:
            self.lanes.start_slots(self.peers.lanes.values())
        self.roster.close_finished(finished)
        await self.roster.announce(written)

    async def _take_over(self):
        """Claim and start what engines that left (dead or stopped) left, within this engine's part of
        the calls their shares free, then take their shares: the slots they free go to their records
        first (those wait at the head of the gate's line), not to ours. Every survivor does this,
        the reaper at the beat that reaped them, the others at once when their watch sees the
        engines' count fall (`_watch`), so the records in flight go out again over all of them."""
        self.roster.take_over(self.peers.free_calls)
        claims = self.trips.claims(time.monotonic(), self.roster.batches) if self.leases.live() else {}
        queued = {pk: run.resumed_queued for pk, run in self.roster.batches.items()}
        passed = await self._trip(claims)
        for pk, run in self.roster.batches.items():
            if run.resumed_queued > queued.get(pk, 0):
                self.peers.took_over(run.lane, run.resumed_queued - queued.get(pk, 0))
        await self._pass_on(*passed)
        await asyncio.sleep(0)  # the new slots run up to the gate
        self.peers.reshare()  # and the take-over is done (peers.resuming)

    async def _poll(self):
        sent, rows = await self.db(self._read_batches)
        await self.roster.poll(rows)
        self.fence.read(sent)  # after the roster stopped the batches it found cancelling (fence.py)
        fairness.set_needs(self.roster.batches.values(), {row["pk"]: row for row in rows}, self.engines, timezone.now())
        self.peers.set_caps(rows)
        self.roster.resume(self.peers.take_freed())  # a lane opened for a new batch beat: perhaps some

    def _read_batches(self):
        """The running batches, and when the read was sent: on the database thread, so the time is the
        query's own and not its wait behind a trip (fence.StatusFence)."""
        sent = time.monotonic()
        return sent, store.active_batches(self.only)

    async def _heartbeat(self):
        await self.peers.heartbeat()
        self.roster.resume(self.peers.take_freed())

    async def _open_run(self, row):
        """A batch the roster joins, as this engine works it: on its model's lane, with its seams."""
        lane = await self.peers.lane_for(row["model_id"])
        return BatchRun(row, lane, self.outbound, self.checkpoints, self.guard.spend(row), self.checkers)

    def _closes_batches(self):
        """Closing is left to one engine (the first by rank), so a batch's files are built once;
        an in-process engine closes its own batches. The sweeper closes what a dead one left."""
        return self.only is not None or self.peers.rank == 0

    def _nothing_to_do(self):
        """An in-process engine is done when its batches are closed, or can't run here at all
        (their model has no enabled deployment)."""
        return not self.lanes.running and self.roster.idle()

    # What a Guard asks of its engine (spend.GuardedEngine).

    @property
    def engines(self):
        return self.peers.engines

    def held(self, pk):
        self.roster.held(pk)

    async def _shutdown(self):
        tasks = list(self.lanes.running)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        runs = self.roster.batches
        finished = await self.trips.flush_all(runs, *self.lanes.take_outcomes(runs.values()))
        if not self.stopping:
            self.roster.close_finished(finished)
        self.handback += self.roster.take_handback() + self.lanes.take_handback() + self.roster.hand_back_queued()
        if self.handback:
            await self.db(store.release, self.owner, self.handback)
        await self.peers.close()
        await self.checkers.close()
        await asyncio.gather(
            *self.roster.closes.values(), *filter(None, [self.roster.announcing]), return_exceptions=True
        )
        await self.db(tallies.save, tallies.take()[0])  # the counts since the last heartbeat
        answers = self.lanes.answers
        if answers.waited:
            logger.info(
                "%d model answers waited for room in the answer budget (peak held: %d bytes)",
                answers.waited,
                answers.peak,
            )
        await self.db(self._cleanup)

    def _cleanup(self):
        for run in self.roster.batches.values():
            if run.input is not None:
                run.input.close()
        store.retire(self.owner)
        self.liveness.close()
        connections.close_all()

    async def _watch(self):
        """Poll at once when a batch is created: its first call goes out within ~WATCH_S,
        not a poll and a loop's sleep later. Beat at once when an engine's row goes (another
        engine reaped a dead one, or one stopped): this engine's part of what it left is claimed
        now (`_take_over`), not at the next beat or a batch's 1 s look for expired leases. Hear at
        once when another engine was refused a call (Peers.share_refusals)."""
        while not self.stopping:
            await asyncio.sleep(WATCH_S)
            if self.stop_heard is not None and self.stop_heard():
                self._begin_stop()  # qcluster heard SIGTERM: nothing new starts here from now on
                return
            newest, engines, refused = await self.db(store.watched, self.owner)
            if newest != self.newest_batch:
                if self.newest_batch is not None:
                    self.poll_now = True
                    self._wake()
                self.newest_batch = newest
            if self.engine_count is not None and engines < self.engine_count:
                self.beat_now = True
                self._wake()
            self.engine_count = engines
            if refused is not None and refused != self.refused_seen:
                # Another engine was just refused a call (a 503) somewhere: stop slow start there now.
                self.refused_seen = refused
                self.peers.hear_refusals = True
                self._wake()

    def _begin_stop(self):
        if self.stopping:
            return
        logger.info("engine %s stopping: %d records in flight", self.owner, len(self.lanes.running))
        self.stopping = True
        self.stop_deadline = time.monotonic() + self.config.stop_grace_s
        self.lanes.stop()
        self.handback += self.roster.hand_back_queued()
        self._wake()

    def _poll_soon(self):
        self.poll_now = True
        self._wake()

    def _wake(self):
        if self.wake is not None:
            self.wake.set()

    async def _sleep(self, timeout):
        if not self.wake.is_set():
            timer = self.loop.call_later(timeout, self.wake.set)
            await self.wake.wait()
            timer.cancel()
        self.wake.clear()


def run_batch(batch_pk):
    """Work one batch in this process until it is closed: the engine, driven in-process
    (tests, tools). Returns how many records this engine wrote."""
    return asyncio.run(Engine(only=[batch_pk], until_closed=True).run())
