"""The engine: one per worker process, working records of every running batch at once.

The unit of scheduling is the record. Every engine (batches.engine.process
starts one in each django-q2 worker process) reads the running batches from
the database every POLL_S, claims records of each with short leases, and
runs them on one asyncio loop: one lane per model, whose slot coroutines
pick the next record fairly (the organization with the fewest records
running on the model, then its expedited batches, then its least-served) and
whose CallGate hands out the model's call slots just as fairly. Results
flush in bulk, several batches a trip, on one database thread; batches are
closed (finalized, expired, cancelled) on a second one, so a close never
holds up claims.

The database is the ledger: a record is an engine's only while its lease
lives (renewed with the engine's heartbeat every LEASE_S / 4), every write
is conditional on still holding it, and a dead engine's records are
taken over by a live engine within about a second of its death
(batches.engine.liveness), by any engine once their lease runs out at worst.
"""

import asyncio
import logging
import os
import secrets
import socket
import time
from concurrent.futures import ThreadPoolExecutor

from django.db import close_old_connections, connections
from django.utils import timezone

from batches import lifecycle, progress
from batches.dashboard import events
from batches.engine import dbretry, finish, liveness, samples, store, tallies
from batches.engine.calls import budget
from batches.engine.calls.health import Health
from batches.engine.config import EngineConfig
from batches.engine.lanes import BatchRun, Lanes
from batches.engine.peers import DEPLOYMENTS_EVERY_S, HEARTBEAT_S, Peers
from batches.engine.scheduler import OrgCaps
from batches.engine.trips import FLUSH_EVERY_S, CheckpointWriter, Trips
from batches.models import Batch, BatchStatus
from openrelay.lib.outbound import OutboundClient

logger = logging.getLogger("openrelay.engine")

POLL_S = 0.2  # how often the engine reads the running batches
# How often it looks for a new batch (one primary-key lookup): a new batch's first
# call waited for the next poll and then a loop's sleep, 0.17-0.45 s on an idle cluster.
WATCH_S = 0.05


class Engine(Lanes, Peers, Trips):
    """Works every running batch (or, driven in-process, the batches in `only`)."""

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
                await self._trip(claims)
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

    async def _shutdown(self):
        tasks = list(self.running)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._flush_all()
        self.handback += [record.pk for run in self.batches.values() for record, _ in run.queue]
        if self.handback:
            await self.db(store.release, self.owner, self.handback)
        for lane in self.lanes.values():
            await lane.caller.__aexit__(None, None, None)
            lane.gate.close()
        await self.health.close()
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

    # ------------------------------------------------------------ the running batches

    async def _poll(self):
        rows = await self.db(store.active_batches, self.only)
        seen = set()
        now = timezone.now()
        for row in rows:
            pk = row["pk"]
            seen.add(pk)
            run = self.batches.get(pk)
            if row["status"] == BatchStatus.VALIDATING:
                if not await self.db(self._start_batch, pk):
                    continue
                row["status"] = BatchStatus.IN_PROGRESS
            if run is None and row["status"] == BatchStatus.IN_PROGRESS and row["model_id"] is not None:
                run = await self._join(row)
            if run is not None:
                run.status = row["status"]
            if pk in self.closes or not self._closes_batches():
                if run is not None and (row["status"] != BatchStatus.IN_PROGRESS or row["expires_at"] <= now):
                    self._stop_batch(run)
                continue
            close = None
            if row["status"] == BatchStatus.CANCELLING:
                close = finish.complete_cancellation
            elif row["expires_at"] <= now:
                close = finish.expire_if_due
            elif row["completed_count"] + row["failed_count"] >= row["total_count"]:
                close = finish.finalize_if_done
            if close is not None:
                if run is not None:
                    self._stop_batch(run)
                self._close(pk, close)
        for pk in [pk for pk in self.batches if pk not in seen]:
            self._drop(self.batches[pk])
        self._set_caps(rows)

    def _nothing_to_do(self):
        """An in-process engine is done when its batches are closed, or can't run here at all
        (their model has no enabled deployment)."""
        if self.closes or self.running:
            return False
        return all(not run.lane.upstreams and not run.queue for run in self.batches.values())

    def _closes_batches(self):
        """Closing is left to one engine (the first by rank), so a batch's files are built once;
        an in-process engine closes its own batches. The sweeper closes what a dead one left."""
        return self.only is not None or self.rank == 0

    @staticmethod
    def _start_batch(pk):
        batch = Batch.objects.filter(pk=pk, status=BatchStatus.VALIDATING).first()
        # Losing this race to another engine is normal: the winner's status is read next poll.
        return batch is not None and lifecycle.transition(batch, BatchStatus.IN_PROGRESS)

    async def _join(self, row):
        lane = self.lanes.get(row["model_id"])
        if lane is None:
            lane = await self._open_lane(row["model_id"])
        run = BatchRun(row, lane, self.outbound, self.checkpoints)
        run.resume = self.freed.pop(run.pk, 0)
        lane.batches[run.pk] = run
        self.batches[run.pk] = run
        self._wake()  # claim its first records now, not after the loop's next sleep
        return run

    def _stop_batch(self, run):
        """Cancelled, expired or closing: stop its calls in flight and forget its queue
        (whoever closes the batch marks those records; our flush skips them)."""
        if run.closing:
            return
        run.closing = True
        run.queue.clear()
        for task, (owner_run, _) in list(self.running.items()):
            if owner_run is run:
                task.cancel()

    def _drop(self, run):
        self._stop_batch(run)
        del self.batches[run.pk]
        del run.lane.batches[run.pk]
        if run.input is not None:
            self.db_thread.submit(run.input.close)

    def _close(self, pk, close):
        async def closing():
            try:
                await self.loop.run_in_executor(self.closer, self._close_batch, pk, close)
            except Exception:
                logger.exception("closing batch %s failed; the sweeper tries again", pk)
            finally:
                del self.closes[pk]
                self.poll_now = True  # see the batch closed (and let an in-process engine end) at once
                self._wake()

        self.closes[pk] = self.loop.create_task(closing())

    @staticmethod
    def _close_batch(pk, close):
        close_old_connections()
        batch = Batch.objects.select_related("organization").filter(pk=pk).first()
        if batch is not None:
            dbretry.call(close, batch)

    def _close_finished(self, pks):
        """Close the batches this engine's flush finished, whatever its rank: the close is
        conditional (one engine moves a batch to finalizing), and waiting for the
        closing engine's poll cost 0.25-0.45 s a batch."""
        for pk in pks:
            if pk in self.closes:
                continue
            run = self.batches.get(pk)
            if run is not None:
                self._stop_batch(run)
            self._close(pk, finish.finalize_if_done)

    async def _announce(self, written):
        """Live events for the batches this trip wrote, each at most every MIN_INTERVAL_S.

        Sent beside the loop, not in it: a group send to channels-redis costs
        1.5-3 ms, and 100 running batches' events sent one after another held
        every claim and flush back by ~0.4 s. One sending at a time; a batch
        whose turn is skipped is due again after the next trip. The batches'
        progress samples (batches.engine.samples) are taken on the same turn,
        at most every SAMPLE_EVERY_S a batch, before the snapshots are read.
        """
        if self.announcing is not None and not self.announcing.done():
            return
        now = time.monotonic()
        due, sample = [], []
        for pk, count in written.items():
            run = self.batches.get(pk)
            if run is None or not count:
                continue
            if now - run.last_event >= events.MIN_INTERVAL_S:
                run.last_event = now
                due.append(pk)
            if now - run.sampled_at >= progress.SAMPLE_EVERY_S:
                run.sampled_at = now
                sample.append(pk)
        if due or sample:
            self.announcing = self.loop.create_task(self._send_events(due, sample))

    async def _send_events(self, batch_pks, sample=()):
        if sample:
            try:
                await self.db(samples.take, sample)
            except Exception:  # samples draw a chart; the batch's counts are the truth
                logger.warning("could not store progress samples", exc_info=True)
        if batch_pks:
            snapshots = await self.db(events.snapshots, batch_pks)
            await asyncio.gather(*(events.send(event) for event in snapshots))


def run_batch(batch_pk):
    """Work one batch in this process until it is closed: the engine, driven in-process
    (tests, tools). Returns how many records this engine wrote."""
    return asyncio.run(Engine(only=[batch_pk], until_closed=True).run())
