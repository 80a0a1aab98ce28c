"""The dashboard's websockets: live batch snapshots, scoped to the signed-in user's organization.

Two feeds, both answering `{"type": "batch.updated", "batch": <Batch object>, "fields": {...}}`,
`fields` the page's values as batches.dashboard.display writes them (the browser formats nothing):
- `/ws/batches`: every batch of the user's organization (group `org.<id>`);
- `/ws/batches/<batch_id>`: one batch (group `batch.<id>`), joined only after
  checking that the batch belongs to the user's organization.

Workers send their events through the channel layer (batches.live). With
channels-redis (REDIS_URL set) those reach every web process. The in-memory
layer of the embedded default lives inside one process, so events sent by the
worker processes never reach the web process: with that layer each socket
also reads its batches from the database every POLL_INTERVAL_S and pushes
those that changed. Either way the browser only listens.

The browser gets the Batch object of batches.presenters without `errors`
(the rejected records from create are on the page and never change).
Events carry absolute snapshots, so a socket may drop any of them: each
forwards at most one snapshot per batch every MIN_INTERVAL_S (the newest it
holds), only when it differs from the last one sent, and never one older
than that (two workers' events can arrive out of order).
"""

import asyncio
import logging
import math
import time

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.layers import InMemoryChannelLayer
from django.db.models import Q

from batches import live, selectors
from batches.dashboard.display import failures_fragment, live_fields, operator_fragment
from batches.models import TERMINAL_BATCH_STATUSES, Batch, BatchStatus
from batches.presenters import live_batch_object, live_batches
from batches.progress import not_run
from openrelay.core.models import Membership

logger = logging.getLogger("openrelay.dashboard")

MIN_INTERVAL_S = live.MIN_INTERVAL_S
POLL_INTERVAL_S = 0.5
# The organization feed follows at most this many unfinished batches at once
# when it polls (the newest); the page shows the rest as they were rendered.
POLL_LIMIT = 200

# The batch feed's failures card: re-read with every push that moves the failed count, but a
# read may take at most this share of the socket's time (the next one waits 1/share times the
# last one's duration): a 3 ms read (2,808 failures on PostgreSQL, docs/guides/dashboard.md) keeps up with every
# push (MIN_INTERVAL_S); a 0.15 s one (50,000) waits 3 s, and the page's failed count with it.
FAILURES_SHARE = 0.05
NOT_RUN_STATUSES = (BatchStatus.CANCELLED, BatchStatus.EXPIRED)

# Websocket close codes (4000-4999 are the application's).
NOT_SIGNED_IN = 4401
NO_ORGANIZATION = 4403
NOT_FOUND = 4404
NOT_STAFF = 4403  # the same code as NO_ORGANIZATION: forbidden

OPERATOR_EVERY_S = 1.0

_STATUS_RANK = {
    BatchStatus.VALIDATING: 0,
    BatchStatus.IN_PROGRESS: 1,
    BatchStatus.FINALIZING: 2,
    BatchStatus.CANCELLING: 2,
    **{status: 3 for status in TERMINAL_BATCH_STATUSES},
}


def progress(batch):
    """How far a snapshot is: statuses only move forward, counts and tokens only grow."""
    counts = batch["request_counts"]
    tokens = (batch.get("usage") or {}).get("total_tokens", 0)
    return _STATUS_RANK.get(batch["status"], 0), counts["completed"] + counts["failed"], tokens


class Outbox:
    """Per batch: the newest snapshot, sent at most once every `interval` seconds and only when it changed."""

    def __init__(self, send, interval=MIN_INTERVAL_S):
        self._send = send
        self._interval = interval
        self._sent = {}
        self._sent_at = {}
        self._pending = {}
        self._timers = {}

    async def offer(self, batch):
        # The rejected records from create (up to 50,000) are on the page
        # already and never change: they are left out of every push.
        batch = {**batch, "errors": None}
        key = batch["id"]
        newest = self._pending.get(key) or self._sent.get(key)
        if newest is not None and (batch == newest or progress(batch) < progress(newest)):
            return
        self._pending[key] = batch
        if key in self._timers:
            return  # already due to go out; it takes the newest then
        wait = self._sent_at.get(key, -math.inf) + self._interval - time.monotonic()
        if wait <= 0:
            await self._flush(key)
        else:
            self._timers[key] = asyncio.create_task(self._flush_later(key, wait))

    async def _flush_later(self, key, wait):
        await asyncio.sleep(wait)
        del self._timers[key]
        await self._flush(key)

    async def _flush(self, key):
        batch = self._pending.pop(key, None)
        if batch is None or batch == self._sent.get(key):
            return
        self._sent[key], self._sent_at[key] = batch, time.monotonic()
        await self._send(batch)

    def last(self, key):
        """The newest snapshot of `key` sent, if any."""
        return self._sent.get(key)

    def close(self):
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()


def _organization_id(user_pk):
    return Membership.objects.filter(user_id=user_pk).values_list("organization_id", flat=True).first()


class BatchFeedConsumer(AsyncJsonWebsocketConsumer):
    """Shared by both feeds: authorize, join one group, forward (and, in-memory, poll)."""

    group = None
    poller = None
    outbox = None

    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=NOT_SIGNED_IN)
            return
        self.organization_id = await database_sync_to_async(_organization_id)(user.pk)
        if self.organization_id is None:
            await self.close(code=NO_ORGANIZATION)
            return
        group = await database_sync_to_async(self.authorize)()
        if group is None:
            await self.close(code=NOT_FOUND)
            return
        self.outbox = Outbox(self._push)
        self.group = group
        await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        # The page was rendered a moment ago; this closes the gap until the next event.
        await self._refresh()
        if isinstance(self.channel_layer, InMemoryChannelLayer):
            self.poller = asyncio.create_task(self._poll())

    async def disconnect(self, code):
        if self.poller is not None:
            self.poller.cancel()
        if self.outbox is not None:
            self.outbox.close()
        if self.group is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def batch_updated(self, event):
        await self.outbox.offer(event["batch"])

    async def _push(self, batch):
        extras = await database_sync_to_async(self.extras)(batch)
        fields = live_fields(batch, extras.get("not_run", 0))
        await self.send_json({"type": live.EVENT_TYPE, "batch": batch, **extras, "fields": fields})

    def extras(self, batch):
        """What the page shows beside the snapshot (sync: runs in the database thread): how many
        of a cancelled or expired batch's failed records never ran, read once a batch."""
        if batch["status"] not in NOT_RUN_STATUSES:
            return {}
        if not hasattr(self, "not_run"):
            self.not_run = {}
        if batch["id"] not in self.not_run:
            row = (
                Batch.objects.for_org(self.organization_id)
                .filter(public_id=batch["id"])
                .values_list("status", "failed_count", "progress")
                .first()
            )
            self.not_run[batch["id"]] = not_run(*row) if row else 0
        return {"not_run": self.not_run[batch["id"]]}

    async def _poll(self):
        while True:
            await asyncio.sleep(POLL_INTERVAL_S)
            try:
                if not await self._refresh():
                    return
            except Exception:  # the next tick tries again; the socket stays up
                logger.warning("could not read batches for a dashboard socket", exc_info=True)

    async def _refresh(self):
        """Offer the current snapshots; False once there is nothing left to follow."""
        snapshots = await database_sync_to_async(self.read)()
        for batch in snapshots:
            await self.outbox.offer(batch)
        return self.following()

    def authorize(self):
        """The group to join, or None to refuse (sync: runs in the database thread)."""
        raise NotImplementedError

    def read(self):
        """The snapshots to offer now (sync: runs in the database thread)."""
        raise NotImplementedError

    def following(self):
        return True


class OrganizationBatchesConsumer(BatchFeedConsumer):
    """/ws/batches: every batch of the user's organization."""

    watching = ()

    def authorize(self):
        return live.org_group(self.organization_id)

    def read(self):
        # The unfinished batches, plus those unfinished at the last read, so
        # each one's terminal snapshot goes out too.
        batches = list(
            live_batches(Batch.objects.for_org(self.organization_id))
            .filter(Q(pk__in=self.watching) | ~Q(status__in=TERMINAL_BATCH_STATUSES))
            .order_by("-created_at", "-pk")[:POLL_LIMIT]
        )
        self.watching = [batch.pk for batch in batches if not batch.is_terminal]
        return [live_batch_object(batch) for batch in batches]


class BatchConsumer(BatchFeedConsumer):
    """/ws/batches/<batch_id>: one batch of the user's organization, with its failures by code.

    One truth per page: every push that moves the failed count carries the
    failures card, and both are read as of one moment (selectors.failures_with:
    the batch row and its records), so the Failed and Not run tiles, the
    card's badges and its codes always agree. The card's grouped read is held
    to FAILURES_SHARE of the socket's time; while it waits, a snapshot whose
    failed count moved waits with it (the page keeps showing the last agreeing
    pair) and goes out, re-read, when the read is due.
    """

    terminal = False
    failures_for = None  # the failed count of the snapshot the last card was read with
    unrun = 0  # and the card's not-run count: the pushes between cards show it
    failures_at = -math.inf
    failures_every = MIN_INTERVAL_S
    failures_later = None

    def authorize(self):
        batch_id = self.scope["url_route"]["kwargs"]["batch_id"]
        self.batch_pk = (
            Batch.objects.for_org(self.organization_id).filter(public_id=batch_id).values_list("pk", flat=True).first()
        )
        return None if self.batch_pk is None else live.batch_group(batch_id)

    def read(self):
        batch = live_batches(Batch.objects.filter(pk=self.batch_pk)).first()
        if batch is None:  # deleted (its organization was)
            self.terminal = True
            return []
        self.terminal = batch.is_terminal
        return [live_batch_object(batch)]

    def following(self):
        return not self.terminal

    async def _push(self, batch):
        message = await database_sync_to_async(self.message)(batch)
        if message is not None:
            await self.send_json(message)

    def message(self, batch):
        """The push for `batch` (sync: runs in the database thread), or None to hold it until the
        failures card is due."""
        if batch["request_counts"]["failed"] == self.failures_for:
            return {"type": live.EVENT_TYPE, "batch": batch, "fields": live_fields(batch, self.unrun)}
        wait = self.failures_at + self.failures_every - time.monotonic()
        if wait > 0 and batch["status"] not in TERMINAL_BATCH_STATUSES:
            self._failures_later(wait)
            return None
        started = time.monotonic()
        row, failures = selectors.failures_with(live_batches(Batch.objects.filter(pk=self.batch_pk)).first)
        if row is None:
            return None
        fresh = {**live_batch_object(row), "errors": None}
        took = time.monotonic() - started
        self.failures_at, self.failures_every = time.monotonic(), max(MIN_INTERVAL_S, took / FAILURES_SHARE)
        self.failures_for, self.unrun = fresh["request_counts"]["failed"], failures.unrun
        return {
            "type": live.EVENT_TYPE,
            "batch": fresh,
            "not_run": failures.unrun,
            "failures": failures_fragment(fresh["id"], failures),
            "fields": live_fields(fresh, failures.unrun),
        }

    def _failures_later(self, wait):
        """The failures card is due after the throttle: push then, even if no event comes."""
        if self.failures_later is not None and not self.failures_later.done():
            return

        async def later():
            await asyncio.sleep(wait)
            last = self.outbox.last(self.scope["url_route"]["kwargs"]["batch_id"])
            if last is not None:
                await self._push(last)

        self.failures_later = asyncio.run_coroutine_threadsafe(later(), self.loop)

    async def connect(self):
        self.loop = asyncio.get_running_loop()
        await super().connect()

    async def disconnect(self, code):
        if self.failures_later is not None:
            self.failures_later.cancel()
        await super().disconnect(code)


class OperatorConsumer(AsyncJsonWebsocketConsumer):
    """/ws/operator: the operator page's figures, for staff users only.

    Engines publish what the page shows to the database (heartbeats, health,
    leases, progress samples), not as events, so the socket reads it every
    OPERATOR_EVERY_S and pushes the rendered page when it changed.
    """

    poller = None

    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=NOT_SIGNED_IN)
            return
        if not user.is_staff:
            await self.close(code=NOT_STAFF)
            return
        await self.accept()
        self.poller = asyncio.create_task(self._poll())

    async def disconnect(self, code):
        if self.poller is not None:
            self.poller.cancel()

    async def _poll(self):
        shown = None
        while True:
            try:
                html = await database_sync_to_async(operator_fragment)()
            except Exception:  # the next tick tries again; the socket stays up
                logger.warning("could not read the operator figures", exc_info=True)
            else:
                if html != shown:
                    shown = html
                    await self.send_json({"type": "operator.updated", "html": html})
            await asyncio.sleep(OPERATOR_EVERY_S)
