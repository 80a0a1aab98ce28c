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
lives (renewed with the engine's heartbeat every LEASE_S / 4), every write
is conditional on still holding it, and a dead engine's records are
taken over by a live engine within about a second of its death
(batches.engine.liveness), by any engine once their lease runs out at worst.

`Engine` is this file's loop and its life (start, the loop's turn, stop,
shutdown); each other question has a room of its own, one part of Engine
each (docs/engine.md has the map):

- batch_set.py: which batches run here; joining, dropping and closing them;
- lanes.py: which record starts (lanes, claim-ahead, the slot coroutines);
- peers.py: what this engine holds among the others (heartbeat, shares,
  deployments and their health);
- trips.py: the database trips (claims, flushes, checkpoint writes).
"""

import asyncio
import logging
import os
import secrets
import socket
import time
from concurrent.futures import ThreadPoolExecutor

from django.db import connections

from batches.engine import checks, dbretry, liveness, spend, store, warmup
from batches.engine.batch_set import BatchSet
from batches.engine.calls import budget, tallies
from batches.engine.calls.health import Health
from batches.engine.config import EngineConfig
from batches.engine.fairness import OrgCaps
from batches.engine.lanes import Lanes
from batches.engine.peers import DEPLOYMENTS_EVERY_S, HEARTBEAT_S, Peers
from batches.engine.trips import FLUSH_EVERY_S, CheckpointWriter, Trips
from openrelay.lib.outbound import OutboundClient

logger = logging.getLogger("openrelay.engine")

POLL_S = 0.2  # how often the engine reads the running batches
# How often it looks for a new batch (one primary-key lookup): a new batch's first
# call waited for the next poll and then a loop's sleep, 0.17-0.45 s on an idle cluster.
WATCH_S = 0.05


class Engine(BatchSet, Lanes, Peers, Trips):
    """Works every running batch (or, driven in-process, the batches in `only`).

    Its state is set here, in one place; the parts it is made of read and change it.
    """

    def __init__(self, only=None, until_closed=False):
        self.config = EngineConfig.read()
        self.only = set(only) if only is not None else None
        self.until_closed = until_closed
        # An in-process engine watches a few batches: it may look often (tests wait on it).
        self.poll_s = POLL_S if only is None else POLL_S / 4
        self.poll_now = False
        self.owner = f"{socket.gethostname()[:30]}:{os.getpid()}:{secrets.token_hex(4)}"
        self.liveness = liveness.Liveness(self.owner)
        self.beaten = False  # its first heartbeat creates its row; later ones find it (or were fenced)
        self.resuming = False  # dead engines' records were freed: claim them before taking their shares
        self.freed = {}  # batch pk -> records freed of a batch not joined yet (a new engine's first beat)
        self.db_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="openrelay-db")
        self.closer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="openrelay-close")
        self.batches = {}
        self.lanes = {}
        self.caps = OrgCaps()
        self.health = Health(on_change=self._health_changed, on_recovered=self._wake)
        self.rank, self.engines = 0, 1
        self.others_holding = {}  # deployment pk -> calls the other live engines hold there
        self.running = {}  # slot task -> (BatchRun, ClaimedRecord) it runs now
        self.handback = []  # records to give back unfinished (stopping)
        self.closes = {}  # batch pk -> the close running on the closer thread
        self.announcing = None  # the task sending live events, if one is
        self.stopping = False
        self.stop_deadline = None
        self.hop_s = 0.0
        self.pending = 0  # finished records waiting for a flush, over every batch
        self.flush_soon = False  # a batch ran out of records here: write its last ones now
        self.newest_batch = None
        self.worked = 0
        self.loop = None
        self.wake = None
        self.checkpoints = CheckpointWriter(self)
        self.answers = budget.Budget(self.config.answer_budget_bytes)
        self.checkers = checks.Checkers(
            self.config.contract_checkers,
            self.config.contract_check_time_limit_s,
            self.config.contract_check_memory_bytes,
        )
        self.guard = spend.Guard(self)
        self.flushing = []  # the holdings of the outcomes the trip in flight writes

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
                try:
                    if self.only is None:  # a worker's engine (not one driven in-process for given batches)
                        await warmup.warm()
                    await self._heartbeat()
                    await self._poll()
                    await self._main()
                finally:
                    watch.cancel()
                    await asyncio.gather(watch, return_exceptions=True)
                    await self._shutdown()
        finally:
            self.db_thread.shutdown(wait=True)
            self.closer.shutdown(wait=True)
            self.liveness.close()  # here too: a shutdown cut short by the database never reaches _cleanup
        return self.worked

    async def _main(self):
        now = time.monotonic()
        last_poll = last_flush = last_beat = last_renew = last_deployments = now
        while True:
            now = time.monotonic()
            if self.stopping:
                self._stop_step(now)
                if not self.running:
                    break
            else:
                self._start_slots()
            claims = {} if self.stopping else self._claims(now)
            if claims or self._flush_due(now, last_flush):
                await self._pass_on(*await self._trip(claims))
                last_flush = now
            if self.handback:
                pks, self.handback = self.handback, []
                await self.db(store.release, self.owner, pks)
            if self.poll_now or now - last_poll >= self.poll_s:
                last_poll, self.poll_now = now, False
                await self._poll()
                if self.until_closed and self._nothing_to_do():
                    break
            if now - last_beat >= HEARTBEAT_S:
                last_beat = now
                await self._heartbeat()
            if self.resuming:
                await self._take_over()
            if now - last_renew >= self.config.lease_s / 4:
                last_renew = now
                await self.db(store.renew, self.owner, list(self.batches))
            if now - last_deployments >= DEPLOYMENTS_EVERY_S:
                last_deployments = now
                await self._refresh_deployments()
            await self._sleep(FLUSH_EVERY_S)

    async def _pass_on(self, written, claimed, finished):
        """What a trip wrote, claimed and finished goes to the parts that act on it: the lanes start
        the claimed records, the batch set closes the finished batches and announces the written ones."""
        if claimed:
            self._start_slots()
        self._close_finished(finished)
        await self._announce(written)

    async def _take_over(self):
        """Claim and start what dead engines left, then take their shares: the slots they free
        go to their records first (those wait at the head of the gate's line), not to ours."""
        self.resuming = False
        await self._pass_on(*await self._trip(self._claims(time.monotonic())))
        await asyncio.sleep(0)  # the new slots run up to the gate
        self._reshare()

    async def _shutdown(self):
        tasks = list(self.running)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        finished = await self._flush_all()
        if not self.stopping:
            self._close_finished(finished)
        self.handback += [record.pk for run in self.batches.values() for record, _ in run.queue]
        if self.handback:
            await self.db(store.release, self.owner, self.handback)
        for lane in self.lanes.values():
            await lane.caller.__aexit__(None, None, None)
            lane.gate.close()
        await self.health.close()
        await self.checkers.close()
        await asyncio.gather(*self.closes.values(), *filter(None, [self.announcing]), return_exceptions=True)
        await self.db(tallies.save, tallies.take()[0])  # the counts since the last heartbeat
        if self.answers.waited:
            logger.info(
                "%d model answers waited for room in the answer budget (peak held: %d bytes)",
                self.answers.waited,
                self.answers.peak,
            )
        await self.db(self._cleanup)

    def _cleanup(self):
        for run in self.batches.values():
            if run.input is not None:
                run.input.close()
        store.retire(self.owner)
        self.liveness.close()
        connections.close_all()

    async def _watch(self):
        """Poll at once when a batch is created: its first call goes out within ~WATCH_S,
        not a poll and a loop's sleep later."""
        while not self.stopping:
            await asyncio.sleep(WATCH_S)
            newest = await self.db(store.newest_batch)
            if newest != self.newest_batch:
                if self.newest_batch is not None:
                    self.poll_now = True
                    self._wake()
                self.newest_batch = newest

    def _begin_stop(self):
        if self.stopping:
            return
        logger.info("engine %s stopping: %d records in flight", self.owner, len(self.running))
        self.stopping = True
        self.stop_deadline = time.monotonic() + self.config.stop_grace_s
        for run in self.batches.values():
            self.handback += [record.pk for record, _ in run.queue]
            run.queue.clear()
        self._wake()

    def _stop_step(self, now):
        """While stopping: records still waiting for a model that has no healthy deployment
        are handed back at once; after the grace period, every record still running is."""
        for task, (run, _) in list(self.running.items()):
            if now >= self.stop_deadline or run.lane.gate.capacity <= 0:
                task.cancel()

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
