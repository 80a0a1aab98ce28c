"""One worker task on one batch: claim, run concurrently, flush, repeat.

A django-q2 task is synchronous, so the task runs an asyncio loop. All
database work happens on one dedicated thread (Django's ORM is sync-only);
the loop owns the HTTP clients and one coroutine per record.
"""

import asyncio
import logging
import math
import os
import secrets
import socket
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta

import orjson
from django.conf import settings
from django.db import close_old_connections, connections
from django.utils import timezone

from batches import events, lifecycle
from batches.engine import dbretry, dispatch, finish, store
from batches.engine.calls import ModelCaller, Upstream
from batches.engine.outcomes import RecordOutcome
from batches.models import Batch, BatchStatus, Priority
from batches.tasks import enqueue_batch
from files.services import open_content
from openrelay.outbound import OutboundClient

logger = logging.getLogger("openrelay.engine")

FLUSH_EVERY_S = 0.25
FLUSH_SIZE = 500
STATUS_CHECK_EVERY_S = 0.5
PREFETCH_S = 0.25
MIN_PREFETCH = 16


@dataclass
class RecordContext:
    """What a record coroutine may use: the model caller and the batch's facts."""

    batch_pk: int
    batch_public_id: str
    organization_id: int
    endpoint: str
    model_name: str
    caller: ModelCaller
    workflows_enabled: bool = False
    outbound: object = None


def run_batch(batch_pk):
    """Entry point of the q2 task."""
    batch = Batch.objects.select_related("organization").filter(pk=batch_pk).first()
    if batch is None:
        return "gone"
    if batch.status == BatchStatus.VALIDATING:
        # Losing this race to a sibling task is normal (several start at once).
        # refresh_from_db drops the cached organization, so the worker below
        # reads everything it needs before its event loop starts.
        lifecycle.transition(batch, BatchStatus.IN_PROGRESS) or batch.refresh_from_db()
    if batch.status == BatchStatus.CANCELLING:
        finish.complete_cancellation(batch)
        return "cancelled"
    if batch.status != BatchStatus.IN_PROGRESS:
        return batch.status
    if finish.expire_if_due(batch):
        return "expired"
    upstreams = _load_upstreams(batch)
    if not upstreams:
        logger.warning("batch %s: model %s has no enabled deployment; waiting", batch.public_id, batch.model_name)
        return "no deployment"
    worker = BatchWorker(batch, upstreams)
    worked = asyncio.run(worker.run())
    if worker.yielded:
        # Back of the queue: waiting expedited work (or the next slice) goes first.
        enqueue_batch(batch.pk, copies=1)
        return f"ran {worked} records, then re-queued the batch"
    # This thread's connection sat idle through the loop: the database may have restarted since.
    dbretry.call(finish.finalize_if_done, batch)
    return f"ran {worked} records"


def _load_upstreams(batch):
    if batch.model is None or not batch.model.enabled:
        return []
    # A task may use a whole deployment when it works the batch alone; how
    # much of the model it takes next to its siblings is BatchWorker's share.
    return [
        Upstream(d.base_url, d.upstream_name, d.api_key, max(1, d.max_concurrency))
        for d in batch.model.deployments.filter(enabled=True).select_related("model")
    ]


def task_share(total, tasks, cap=None):
    """Records one task keeps running: its part of the model's concurrency among
    `tasks` live tasks on the batch, within the per-task cap (0 or None: no cap)."""
    share = max(1, total // max(1, tasks))
    return min(share, cap) if cap else share


class BatchWorker:
    def __init__(self, batch, upstreams):
        self.batch = batch
        self.upstreams = upstreams
        # Read here, in sync code: inside the event loop a lazy relation load
        # raises SynchronousOnlyOperation.
        self.workflows_enabled = batch.organization.workflows_enabled
        self.owner = f"{socket.gethostname()[:30]}:{os.getpid()}:{secrets.token_hex(4)}"
        self.db_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="openrelay-db")
        self.running = 0  # records being worked now
        self.slots = set()  # slot coroutines: each works queued records one after another
        self.done = []  # (ClaimedRecord, RecordOutcome) waiting for a flush
        self.worked = 0
        self.completed = 0  # records finished in this task (flushed or not)
        self.cursor = 0  # the last line claimed: claims continue past it
        self.queue = deque()  # claimed (ClaimedRecord, line bytes) not started yet
        self.stopping = False
        self.yielded = False
        self.slice_ends = time.monotonic() + settings.OPENRELAY_TASK_SLICE_S
        self.task_cap = settings.OPENRELAY_TASK_CONCURRENCY
        self.organization_cap = batch.organization.max_concurrency
        self.input = None
        self.last_event = 0.0

    async def db(self, fn, *args):
        # dbretry: a database restart costs a pause, not the task.
        return await asyncio.get_running_loop().run_in_executor(self.db_thread, dbretry.call, fn, *args)

    async def run(self):
        try:
            self.input = await self.db(self._open_input)
            caller = ModelCaller(
                self.upstreams, time_limit_s=settings.OPENRELAY_CALL_TIME_LIMIT_S, retries=settings.OPENRELAY_UPSTREAM_RETRIES
            )
            async with caller, OutboundClient() as outbound:
                self.ctx = self._context(caller, outbound)
                self.model_capacity = caller.capacity
                # Until the next count, assume every task handed the batch
                # runs now (they usually start together), besides the tasks
                # already at work for other batches.
                await self._loop(self._share(*await self.db(self._siblings), starting=True))
        finally:
            await self.db(self._cleanup)
            self.db_thread.shutdown(wait=True)
        return self.worked

    def _context(self, caller, outbound):
        return RecordContext(
            batch_pk=self.batch.pk,
            batch_public_id=self.batch.public_id,
            organization_id=self.batch.organization_id,
            endpoint=self.batch.endpoint,
            model_name=self.batch.model_name,
            caller=caller,
            workflows_enabled=self.workflows_enabled,
            outbound=outbound,
        )

    def _open_input(self):
        close_old_connections()
        return open_content(self.batch.input_file)

    def _cleanup(self):
        if self.input is not None:
            self.input.close()
        connections.close_all()

    async def _loop(self, capacity):
        """Keep `capacity` records running, claiming ahead and flushing behind.

        Slot coroutines (_slot) work claimed records one after another and
        wake this loop when the claim-ahead runs low or a flush is full (no
        asyncio.wait over every task in flight, which cost O(in flight) per
        wake-up); otherwise it wakes every FLUSH_EVERY_S. A claim and a
        flush share one transaction on the database thread (_Trip).
        """
        self.capacity = capacity
        # Claimed-but-unstarted records: claim when fewer than `low` wait,
        # up to low + batch (both follow the completion rate, _adapt_prefetch).
        self.low = self.batch_size = min(capacity, MIN_PREFETCH)
        self.hop_s = 0.0  # how long a flush-and-claim trip to the database takes (moving average)
        self.wake = asyncio.Event()
        self.exhausted = False
        rate_mark = (time.monotonic(), 0)
        last_flush = last_check = last_renew = time.monotonic()
        while True:
            now = time.monotonic()
            want = 0
            if self._room():
                rate_mark = self._adapt_prefetch(rate_mark, now)
                # self.capacity, not the starting share: _reshare moves it while the loop runs.
                want = self.capacity + self.low + self.batch_size - self.running - len(self.queue)
                want = max(0, min(want, max(settings.OPENRELAY_CLAIM_CHUNK, self.capacity)))
            if want or (self.done and (len(self.done) >= FLUSH_SIZE or now - last_flush >= FLUSH_EVERY_S)):
                claimed = await self._flush_and_claim(want)
                last_flush = now
                if want and not claimed:
                    self.exhausted = True
            if self.stopping and self.queue:
                # Claimed but never started: back to pending for whoever runs next.
                await self.db(store.release, self.batch.pk, self.owner, [record.pk for record, _ in self.queue])
                self.queue.clear()
            if not self.running and not self.queue and (self.exhausted or self.stopping):
                break
            if now >= self.slice_ends and not self.stopping:
                # Long batches are worked in slices: finish what is in flight,
                # then hand the batch to a fresh task at the back of the queue.
                self.stopping = self.yielded = True
                continue
            if now - last_check >= STATUS_CHECK_EVERY_S:
                last_check = now
                await self._check_status()
                if self.stopping:
                    continue
            if now - last_renew >= settings.OPENRELAY_LEASE_S / 3:
                last_renew = now
                await self.db(store.renew, self.batch.pk, self.owner)
            await self._sleep(FLUSH_EVERY_S)
        if self.slots:  # slots with nothing left to work end on their own
            await asyncio.gather(*self.slots, return_exceptions=True)
        await self._flush()
        await self._announce(force=True)

    def _room(self):
        """Is it time to claim: a slot idle, or fewer than `low` claimed records waiting for one?"""
        return (
            not self.stopping
            and not self.exhausted
            and (self.running < self.capacity or len(self.queue) < self.low)
        )

    def _adapt_prefetch(self, mark, now):
        """Size the claim-ahead from the recent completion rate and the database's round trip.

        `low` covers what the slots finish during two trips to the database
        (so they never wait for a claim), `batch_size` about PREFETCH_S of
        work (so claims stay few); both at least min(capacity, MIN_PREFETCH).
        Small for a slow model, so at the end of a batch no task sits on
        records another task could be running.
        """
        since, completed = mark
        if now - since < 0.05:
            return mark
        rate = (self.completed - completed) / (now - since)
        floor = min(self.capacity, MIN_PREFETCH)
        chunk = settings.OPENRELAY_CLAIM_CHUNK
        self.low = max(floor, min(chunk, math.ceil(rate * 2 * self.hop_s)))
        self.batch_size = max(floor, min(chunk, int(rate * PREFETCH_S)))
        return now, self.completed

    async def _sleep(self, timeout):
        if not self.wake.is_set():
            timer = asyncio.get_running_loop().call_later(timeout, self.wake.set)
            await self.wake.wait()
            timer.cancel()
        self.wake.clear()

    async def _flush_and_claim(self, want):
        outcomes, self.done = self.done, []
        started = time.monotonic()
        trip = _Trip(self, outcomes, want, self.cursor)
        written, claimed = await self.db(trip)
        self.hop_s = 0.7 * self.hop_s + 0.3 * (time.monotonic() - started)
        self.worked += written
        if claimed:
            self.queue.extend(claimed)
            self.cursor = max(self.cursor, claimed[-1][0].line)
            self._start_queued()
        if outcomes:
            await self._announce()
        return claimed

    def _start_queued(self):
        """Enough slot coroutines for the queue, up to capacity.

        A slot works queued records one after another, like the workers of
        a bare client: no Task and no done callback per record.
        """
        if self.stopping:
            return
        # Every live slot is busy with a record and takes the next one itself.
        for _ in range(min(self.capacity - len(self.slots), len(self.queue))):
            slot = asyncio.create_task(self._slot())
            self.slots.add(slot)
            slot.add_done_callback(self.slots.discard)

    async def _slot(self):
        # A slot leaves when the queue is empty, when the batch stops, or when
        # a reshare left more slots than capacity (after its current record).
        while self.queue and not self.stopping and len(self.slots) <= self.capacity:
            record, raw = self.queue.popleft()
            self.running += 1
            try:
                outcome = await self._execute(record, raw)
            except asyncio.CancelledError:
                raise  # the batch was cancelled or expired: whoever closes it marks the record
            except Exception as exc:
                logger.error("record %s of %s crashed: %r", record.line, self.batch.public_id, exc)
                outcome = RecordOutcome.error("internal_error", "The record failed inside the worker.")
            finally:
                self.running -= 1
            self.done.append((record, outcome))
            self.completed += 1
            if len(self.done) >= FLUSH_SIZE or not self.running or self._room():
                self.wake.set()
        self.slots.discard(asyncio.current_task())
        self.wake.set()

    async def _execute(self, record, raw):
        try:
            body = orjson.loads(raw)["body"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return RecordOutcome.error("invalid_json_line", "The input line could no longer be read as JSON.")
        return await dispatch.run_record(self.ctx, record, body)

    async def _flush(self):
        if not self.done:
            return
        batch, self.done = self.done, []
        self.worked += await self.db(store.flush, self.batch.pk, self.owner, batch)
        await self._announce()

    async def _announce(self, force=False):
        now = time.monotonic()
        if not force and now - self.last_event < events.MIN_INTERVAL_S:
            return
        self.last_event = now
        await events.send(await self.db(events.snapshot, self.batch.pk))

    def _siblings(self):
        """Other live tasks: (calling this batch's model, working this organization's batches)."""
        batch = self.batch
        if batch.model_id is None:  # the model was deleted: only the batch's own tasks are known
            on_model = store.live_siblings(self.owner, batch_pk=batch.pk)
        else:
            on_model = store.live_siblings(self.owner, model_id=batch.model_id)
        in_organization = (
            store.live_siblings(self.owner, organization_id=batch.organization_id) if self.organization_cap else 0
        )
        return on_model, in_organization

    def _status_and_siblings(self):
        return store.batch_status(self.batch.pk), self._siblings()

    def _share(self, on_model, in_organization, starting=False):
        """Calls this task may keep in flight: its equal part of the model's concurrency
        among the tasks calling the model, and of its organization's cap (if any) among
        the organization's tasks, within OPENRELAY_TASK_CONCURRENCY."""
        # At the start, the batch's sibling tasks may not hold leases yet.
        floor = settings.OPENRELAY_TASKS_PER_BATCH if starting else 1
        share = task_share(self.model_capacity, max(floor, on_model + 1), self.task_cap)
        if self.organization_cap:
            share = min(share, task_share(self.organization_cap, max(floor, in_organization + 1)))
        return share

    def _reshare(self, on_model, in_organization):
        """Move this task's capacity to its share among the tasks at work now.

        Each task re-counts its live siblings every STATUS_CHECK_EVERY_S, so
        a lone task (fewer workers free than OPENRELAY_TASKS_PER_BATCH, or
        the others done) grows to the whole deployment, and a task that
        gains siblings (on its batch, on another batch of the model, or in
        its capped organization) shrinks: it stops starting records until it
        is under its new share; nothing in flight is cut.
        """
        capacity = self._share(on_model, in_organization)
        if capacity != self.capacity:
            self.capacity = capacity
            self._start_queued()
            self.wake.set()

    async def _check_status(self):
        status, siblings = await self.db(self._status_and_siblings)
        self._reshare(*siblings)
        # expires_at is fixed at create: no need to read it again.
        if status == BatchStatus.IN_PROGRESS and self.batch.expires_at <= timezone.now():
            status = "expired"
        if (
            status == BatchStatus.IN_PROGRESS
            and self.batch.priority != Priority.EXPEDITED
            and not self.stopping
            and await self.db(store.expedited_waiting)
        ):
            # Expedited work goes first: stop claiming, finish what is in
            # flight, then give this worker slot up.
            self.stopping = self.yielded = True
            return
        if status != BatchStatus.IN_PROGRESS and not self.stopping:
            # Cancelled or expired: stop in-flight calls. Whoever closes the
            # batch marks their records; our flush skips them.
            self.stopping = True
            await self._flush()
            for slot in list(self.slots):
                slot.cancel()


class _Trip:
    """One flush-and-claim trip to the database, as dbretry calls it (again after a lost connection).

    Its lease time is fixed when the trip starts, so a retry can take back
    what an attempt whose answer was lost had leased already.
    """

    def __init__(self, worker, outcomes, want, cursor):
        self.worker, self.outcomes, self.want, self.cursor = worker, outcomes, want, cursor
        self.lease_until = timezone.now() + timedelta(seconds=settings.OPENRELAY_LEASE_S)
        self.attempts = 0
        self.__name__ = "flush_and_claim"  # dbretry names the call it retries

    def __call__(self):
        self.attempts += 1
        worker = self.worker
        written, records = store.flush_and_claim(
            worker.batch.pk, worker.owner, self.outcomes, self.want, after_line=self.cursor,
            lease_until=self.lease_until, recover=self.attempts > 1,
        )
        claimed = []
        for record in records:
            # In line order: the reads walk the file forward.
            worker.input.seek(record.offset)
            claimed.append((record, worker.input.read(record.length)))
        return written, claimed
