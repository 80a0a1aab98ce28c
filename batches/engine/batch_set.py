"""The batches this engine works: which are running (the poll), joining and leaving them, closing them.

Every POLL_S (at once when a batch is created: runner.Engine._watch) the
engine reads the running batches, starts the validated ones, joins a new
batch to its model's lane (batches.engine.lanes), drops the ones gone, and
closes (finalizes, expires, cancels: batches.engine.finish) the ones due, on
the closer thread so a close never holds up a trip. Closing is the first
engine's by rank; the sweeper closes what a dead one left. Live events and
progress samples of the batches a trip wrote go out beside the loop.
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.db import close_old_connections, connection
from django.utils import timezone

from batches import lifecycle, progress
from batches import live as events
from batches.engine import dbretry, finish, samples
from batches.engine.lanes import BatchRun
from batches.engine.spend import Guard
from batches.engine.trips import RECHECK_S
from batches.models import Batch, BatchStatus

logger = logging.getLogger("openrelay.engine")

# A close that raised (its bucket or database away) is tried again after this, doubled each time up to
# CLOSE_RETRY_MAX_S: once it had moved the batch to finalizing, no poll would see it again, and the
# sweeper redoes a close only after sweeper.STUCK_FINALIZING (5 min; S3 down 30 s in the hosts tier).
CLOSE_RETRY_S = 1.0
CLOSE_RETRY_MAX_S = 30.0


class Roster:
    """The Engine's running batches (a part of runner.Engine): `batches` ({pk: BatchRun}) and their
    closes. It joins a batch through `open_run` (runner.Engine._open_run: its lane and its seams),
    stops a closing batch's records through `cancel` (lanes.Lanes.cancel), and asks `closes_batches`
    whether this engine closes batches at all (the first by rank: peers.Peers)."""

    def __init__(
        self,
        only: set[int] | None,
        guard: Guard,
        db: Callable[..., Coroutine[Any, Any, Any]],
        threads: tuple[ThreadPoolExecutor, ThreadPoolExecutor],
        open_run: Callable[[dict[str, Any]], Awaitable[BatchRun]],
        cancel: Callable[[BatchRun], None],
        closes_batches: Callable[[], bool],
        wake: Callable[[], None],
        poll_soon: Callable[[], None],
    ) -> None:
        self.only = only  # driven in-process: these batches only
        self.guard = guard
        self.db = db  # a call on the engine's database thread (runner.Engine.db)
        self.db_thread, self.closer = threads  # the database thread, and the thread that closes batches
        self.open_run = open_run
        self.cancel = cancel
        self.closes_batches = closes_batches
        self.wake = wake  # ends the loop's sleep (runner.Engine._wake)
        self.poll_soon = poll_soon  # poll at the loop's next turn, and wake it
        self.batches: dict[int, BatchRun] = {}
        self.freed: dict[
            int, int
        ] = {}  # batch pk -> records freed of a batch not joined yet (a new engine's first beat)
        self.closes: dict[int, asyncio.Task[Any]] = {}  # batch pk -> the close running on the closer thread
        self.close_retries: dict[int, tuple[int, float]] = {}  # batch pk -> (closes failed, when to try again)
        self.announcing: asyncio.Task[Any] | None = None  # the task sending live events, if one is
        self.handback: list[int] = []  # records of batches paused here, to give back (take_handback)
        self.stopping = False  # the engine stops: no call waiting at the gate is sent (hand_back_queued)

    async def poll(self, rows):
        """The running batches as the database has them now (`rows`): start, join, close, drop; and the
        closes that failed, again once due."""
        self._retry_closes()
        for pk in self.guard.polled(rows):
            self.held(pk)
        if due := self.guard.budgets_due():
            self.guard.budgets_read(await self.db(self.guard.read_budgets, due))
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
            if pk in self.closes or not self.closes_batches():
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

    def idle(self):
        """No close running and nothing this engine can still do for its batches (an in-process engine
        ends then): each is done, or can't run here at all (its model has no enabled deployment)."""
        if self.closes or self.close_retries:
            return False
        return all(not run.lane.upstreams and not run.queue for run in self.batches.values())

    def take_handback(self):
        pks, self.handback = self.handback, []
        return pks

    def hand_back_queued(self):
        """Stopping: forget every record claimed and not started, and send none of the calls waiting
        at the gate (each goes back as its slot comes: fairness.Held). Returns the queued pks, to
        give back. Let out, the calls waiting went out as the calls in flight ended: 58 calls after
        a SIGTERM with 8 calls in flight an engine and 24 more records waiting at its gate."""
        self.stopping = True
        for run in self.batches.values():
            run.ticket.held = True
        return [pk for run in self.batches.values() for pk in run.hand_back()]

    def resume(self, freed):
        """Claim at once what dead engines left of our batches ({batch pk: records freed}: peers.Peers.take_freed)."""
        for pk, n in freed.items():
            run = self.batches.get(pk)
            if run is not None:
                run.resume += n
                run.recheck_at = run.expired_check_at = 0.0
            else:
                self.freed[pk] = self.freed.get(pk, 0) + n

    def take_over(self, free_calls):
        """Engines left: claim this engine's part of what they left now (the sent records a take-over
        set aside for it: liveness.take_over), and as many others as the calls their shares free
        here (`free_calls(lane)`: peers.Peers.free_calls), batch by batch. Every batch claims from
        its first pending line again: what the dead engines had only claimed ahead is pending below
        the cursor."""
        left = {}
        for run in self.batches.values():
            if not run.workable:
                continue
            lane = run.lane
            if lane.model_id not in left:
                left[lane.model_id] = max(0, free_calls(lane) - sum(r.resumed_queued for r in lane.batches.values()))
            run.resume = left[lane.model_id]
            left[lane.model_id] -= run.resume
            run.cursor = 0
            run.recheck_at = 0.0
            # Without calls free for them here, this engine leaves the records in flight to the others.
            run.expired_check_at = 0.0 if run.resume else time.monotonic() + RECHECK_S

    @staticmethod
    def _start_batch(pk):
        batch = Batch.objects.filter(pk=pk, status=BatchStatus.VALIDATING).first()
        # Losing this race to another engine is normal: the winner's status is read next poll.
        return batch is not None and lifecycle.transition(batch, BatchStatus.IN_PROGRESS)

    async def _join(self, row):
        run = await self.open_run(row)
        run.resume = self.freed.pop(run.pk, 0)
        run.lane.batches[run.pk] = run
        self.batches[run.pk] = run
        self.wake()  # claim its first records now, not after the loop's next sleep
        return run

    def _stop_batch(self, run):
        """Cancelled, expired or closing: stop its calls in flight and forget its queue
        (whoever closes the batch marks those records; our flush skips them)."""
        if run.closing:
            return
        run.closing = True
        run.queue.clear()
        self.cancel(run)

    def held(self, pk):
        """Its guardrails paused the batch (hand back what it has queued: it claims nothing now)
        or it was resumed (claim again at once). Calls in flight finish either way."""
        run = self.batches.get(pk)
        if run is None:
            return
        # Calls waiting at the gate are not sent while it is paused, nor once the engine stops.
        run.ticket.held = self.stopping or (run.spend is not None and run.spend.paused)
        if not run.workable:
            self.handback += run.hand_back()
            run.cursor = 0  # resumed, it claims from its first pending line again
        else:
            run.recheck_at = run.expired_check_at = 0.0
            self.wake()

    def _drop(self, run):
        self._stop_batch(run)
        self.guard.forget(run.pk)
        del self.batches[run.pk]
        del run.lane.batches[run.pk]
        if run.input is not None:
            self.db_thread.submit(run.input.close)

    def _close(self, pk, close):
        async def closing():
            try:
                await asyncio.get_running_loop().run_in_executor(self.closer, self._close_batch, pk, close)
                self.close_retries.pop(pk, None)
            except Exception:
                failed = self.close_retries.get(pk, (0, 0.0))[0] + 1
                delay = min(CLOSE_RETRY_MAX_S, CLOSE_RETRY_S * 2 ** (failed - 1))
                self.close_retries[pk] = (failed, time.monotonic() + delay)
                logger.exception("closing batch %s failed (%d times); tried again in %g s", pk, failed, delay)
            finally:
                del self.closes[pk]
                self.poll_soon()  # see the batch closed (and let an in-process engine end) at once

        self.closes[pk] = asyncio.get_running_loop().create_task(closing())

    def _retry_closes(self):
        now = time.monotonic()
        for pk, (_, due) in list(self.close_retries.items()):
            if due <= now and pk not in self.closes:
                self._close(pk, finish.close_again)

    @staticmethod
    def _close_batch(pk, close):
        close_old_connections()
        try:
            batch = Batch.objects.select_related("organization").filter(pk=pk).first()
            if batch is not None:
                dbretry.call(close, batch)
        finally:
            # libpq keeps the buffer of the largest message a connection read until it closes (a
            # result file's 134 MB answers: 128 MB of the worker's memory for good, measured); a
            # close is once a batch, and connecting again costs a few ms.
            connection.close()

    def close_finished(self, pks):
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

    async def announce(self, written):
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
            self.announcing = asyncio.get_running_loop().create_task(self._send_events(due, sample))

    async def _send_events(self, batch_pks, sample=()):
        if sample:
            try:
                await self.db(samples.take, sample)
            except Exception:  # samples draw a chart; the batch's counts are the truth
                logger.warning("could not store progress samples", exc_info=True)
        if batch_pks:
            snapshots = await self.db(events.snapshots, batch_pks)
            await asyncio.gather(*(events.send(event) for event in snapshots))
