"""One worker task on one batch: claim, run concurrently, flush, repeat.

A django-q2 task is synchronous, so the task runs an asyncio loop. All
database work happens on one dedicated thread (Django's ORM is sync-only);
the loop owns the HTTP clients and one coroutine per record.
"""

import asyncio
import logging
import os
import secrets
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import orjson
from django.conf import settings
from django.db import close_old_connections, connections

from batches import events, lifecycle
from batches.engine import finish, store
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
    finish.finalize_if_done(batch)
    return f"ran {worked} records"


def _load_upstreams(batch):
    if batch.model is None or not batch.model.enabled:
        return []
    share = max(1, settings.OPENRELAY_TASKS_PER_BATCH)
    return [
        # Several tasks work one batch; each takes its share of a deployment's
        # concurrency so together they stay within it.
        Upstream(d.base_url, d.upstream_name, d.api_key, max(1, d.max_concurrency // share))
        for d in batch.model.deployments.filter(enabled=True).select_related("model")
    ]


class BatchWorker:
    def __init__(self, batch, upstreams):
        self.batch = batch
        self.upstreams = upstreams
        self.owner = f"{socket.gethostname()[:30]}:{os.getpid()}:{secrets.token_hex(4)}"
        self.db_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="openrelay-db")
        self.inflight = {}  # task -> ClaimedRecord
        self.done = []  # (ClaimedRecord, RecordOutcome) waiting for a flush
        self.worked = 0
        self.stopping = False
        self.yielded = False
        self.slice_ends = time.monotonic() + settings.OPENRELAY_TASK_SLICE_S
        self.input = None
        self.last_event = 0.0

    async def db(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.db_thread, fn, *args)

    async def run(self):
        try:
            self.input = await self.db(self._open_input)
            caller = ModelCaller(
                self.upstreams, time_limit_s=settings.OPENRELAY_CALL_TIME_LIMIT_S, retries=settings.OPENRELAY_UPSTREAM_RETRIES
            )
            async with caller, OutboundClient() as outbound:
                self.ctx = self._context(caller, outbound)
                await self._loop(caller.capacity)
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
            workflows_enabled=self.batch.organization.workflows_enabled,
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
        chunk = min(settings.OPENRELAY_CLAIM_CHUNK, max(capacity, 1))
        last_flush = last_check = last_renew = time.monotonic()
        exhausted = False
        while True:
            if not self.stopping and not exhausted and len(self.inflight) < capacity:
                exhausted = not await self._claim_more(min(chunk, capacity * 2 - len(self.inflight)))
            if not self.inflight and (exhausted or self.stopping):
                break
            await self._collect(timeout=FLUSH_EVERY_S)
            now = time.monotonic()
            if self.done and (len(self.done) >= FLUSH_SIZE or now - last_flush >= FLUSH_EVERY_S):
                await self._flush()
                last_flush = now
            if now >= self.slice_ends and not self.stopping:
                # Long batches are worked in slices: finish what is in flight,
                # then hand the batch to a fresh task at the back of the queue.
                self.stopping = self.yielded = True
            if now - last_check >= STATUS_CHECK_EVERY_S:
                last_check = now
                await self._check_status()
            if now - last_renew >= settings.OPENRELAY_LEASE_S / 3:
                last_renew = now
                await self.db(store.renew, self.batch.pk, self.owner)
        await self._flush()
        await self._announce(force=True)

    async def _claim_more(self, limit):
        claimed = await self.db(self._claim_and_read, limit)
        for record, raw in claimed:
            task = asyncio.create_task(self._execute(record, raw))
            self.inflight[task] = record
        return bool(claimed)

    def _claim_and_read(self, limit):
        records = store.claim(self.batch.pk, self.owner, limit)
        out = []
        for record in records:  # in line order: the reads walk the file forward
            self.input.seek(record.offset)
            out.append((record, self.input.read(record.length)))
        return out

    async def _execute(self, record, raw):
        try:
            body = orjson.loads(raw)["body"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return RecordOutcome.error("invalid_json_line", "The input line could no longer be read as JSON.")
        from batches.engine import dispatch

        return await dispatch.run_record(self.ctx, record, body)

    async def _collect(self, timeout):
        if not self.inflight:
            return
        done, _ = await asyncio.wait(self.inflight, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            record = self.inflight.pop(task)
            if task.cancelled():
                continue
            exc = task.exception()
            if exc is not None:
                logger.error("record %s of %s crashed: %r", record.line, self.batch.public_id, exc)
                outcome = RecordOutcome.error("internal_error", "The record failed inside the worker.")
            else:
                outcome = task.result()
            self.done.append((record, outcome))

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

    async def _check_status(self):
        status = await self.db(store.batch_status, self.batch.pk)
        if status == BatchStatus.IN_PROGRESS and await self.db(finish.window_passed, self.batch.pk):
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
            for task in self.inflight:
                task.cancel()
