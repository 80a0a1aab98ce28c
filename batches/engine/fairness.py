"""Fairness: who goes next, decided here for every level, in one order (`turn`).

- Between engines (worker processes on any machine): every live engine can
  claim any record, so a deployment's max_concurrency (and an
  organization's cap) is split evenly over the live engines by rank
  (`split`; batches.engine.peers applies it at each heartbeat). An engine
  that joins or leaves moves every share at the next heartbeat.
- Between organizations, inside an engine, and between one organization's
  batches: `turn` orders them, and both places that choose use it: which
  record starts next on a model (batches.engine.lanes.Lane.pick, counting
  records running) and which waiting call gets the model's next call slot
  (`CallGate`, counting calls in flight): the organization with the fewest
  running (within its cap, `OrgCaps`), then its expedited batches (never
  ahead of another organization's fair share), then its batch with the
  fewest running, then its least served (round robin when they are even).

Work-conserving: a slot nobody else waits for goes to whoever waits.

Deadlines first (`deadline_need`, docs/concepts/how-batches-run.md#deadlines): a
batch whose records left would not finish by its expires_at gets, ahead of
everything above and across organizations, the records running and the calls
it needs to finish in time with headroom: no more (past its need it takes its
turn like any other), and together at most DEADLINE_MAX_SHARE of the model,
so the batches with slack keep progressing.

A call stands at the gate as its record does (`place_record`, set by the
slot that runs the record): a record a dead engine had in flight goes to the
head of its batch's line, behind the others it left there (line order), and a
record's prompt prefix steers its calls to the deployment that has the prefix
cached (batches.engine.prefixes).
"""

import asyncio
import math
import time
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

from batches import windows
from batches.engine import prefixes

# Set by the engine for a record a dead engine had in flight (batches.engine.liveness): its
# calls wait at the head of their batch's line, not behind the records claimed since.
first_in_line = ContextVar("first_in_line", default=False)

# Calls past a deployment's adaptive limit at once (an engine's), each the first call of an organization
# with none in flight on the model, so one tenant's slow calls, holding the whole limit, never hold
# another's first call (issue 55: 15-60 s behind 134 MB embeddings answers). Two, not one: two
# tenants arriving together both go at once; and few, as flow control holds the limit where the
# server's line is short: every call past it waits in that line or is refused (then none goes past
# for EXPRESS_PAUSE_S). The engine's part of max_concurrency is never passed.
EXPRESS_CALLS = 2
EXPRESS_PAUSE_S = 30.0

# Calls a gate times before it trusts its measured seconds a call (`CallGate.call_s`), then each sample's.
CALL_SAMPLE = 32


def turn(org_running, expedited, batch_running, batch_served=0, behind=False):
    """The order of who goes next, smallest first: a batch behind its deadline (below its need,
    `deadline_need`) first, whatever its organization; then the organization with the fewest running,
    then its expedited batches, then its batch with the fewest running, then its least served.

    Expedited goes first within an organization's fair share, never across organizations (issue
    42: one tenant's expedited batches held another's standard batch to 29 s); a deadline goes
    across them, but only up to what it needs."""
    return (not behind, org_running, not expedited, batch_running, batch_served)


def deadline_need(left, seconds_left, window_s, call_s, engines):
    """Calls in flight this engine should give a batch for its `left` records to finish in time: its
    part of them (the live `engines` share them evenly) at the model's measured `call_s` seconds a
    call, over the time until DEADLINE_MARGIN of its `window_s` is left (at least a second: past it,
    all it can get). By Little's law: calls in flight = the rate needed x seconds a call; the quote's
    pace (batches.estimate.pace) is the same figure, a model's records a second = its slots / seconds
    a call. 0 when less than one call would do (the fair share gives every waiting batch that), or
    the model's pace is not measured yet."""
    if left <= 0 or not call_s:
        return 0
    need = left / max(1, engines) * call_s / windows.seconds_to_aim(seconds_left, window_s)
    return math.ceil(need) if need >= 1 else 0


def deadline_cap(capacity):
    """The most slots of a model the batches behind their deadlines may take before the others."""
    return max(1, int(windows.DEADLINE_MAX_SHARE * capacity)) if capacity > 0 else 0


def set_needs(runs, rows, engines, now):
    """Each running batch's need (`deadline_need`) from the poll's rows ({pk: row}): the records it
    has left and its expires_at, at its model's measured seconds a call. Its Ticket carries it to
    the gate and to Lane.pick."""
    for run in runs:
        row = rows.get(run.pk)
        if row is None:
            continue
        left = row["total_count"] - row["completed_count"] - row["failed_count"]
        seconds_left = (row["expires_at"] - now).total_seconds()
        window_s = (row["expires_at"] - row["created_at"]).total_seconds()
        run.ticket.need = deadline_need(left, seconds_left, window_s, run.lane.gate.call_s, engines)


# Set by the engine for the record a slot starts: marks it sent (batches.engine.trips.SentMarks),
# or finds it marked ahead, or raises checkpoints.LeaseLost if it is no longer this engine's. The
# record's first call awaits it once it has a slot at the gate, before it goes out
# (calls.caller.ModelCaller.call), so a record whose call went out is marked on its row; one
# merely started, waiting at the gate, is not, but for the few marked ahead (SentMarks says how few).
first_send: ContextVar[Callable[[], Awaitable[None]] | None] = ContextVar("first_send", default=None)


def place_record(prefix, resumed, mark=None):
    """The record the running slot works on now, as its calls stand at the gate: its prompt
    prefix's key (the deployment it prefers), whether a dead engine had it in flight, and what
    its first call awaits before it goes out (`first_send`)."""
    prefixes.current_key.set(prefix)
    first_in_line.set(resumed)
    first_send.set(mark)


def split(total, rank, count):
    """This engine's part of `total` when `count` live engines share it; `rank` is its place among them.

    The parts add up to `total` exactly (the first total % count engines
    take one more), so the engines together never exceed a limit. A part
    may be 0 when there are more engines than slots.
    """
    count = max(1, count)
    rank = rank % count
    return total // count + (1 if rank < total % count else 0)


class Held(Exception):
    """A call not sent: its batch is paused (batches.engine.spend). Its record goes back to pending."""


class Ticket:
    """One batch's standing at a gate: who it belongs to and how many calls it has in flight;
    `held` while the batch is paused, so calls still waiting for a slot are not sent."""

    __slots__ = ("batch_pk", "organization_id", "expedited", "calls", "held", "need")

    def __init__(self, batch_pk, organization_id, expedited=False):
        self.batch_pk = batch_pk
        self.organization_id = organization_id
        self.expedited = expedited
        self.calls = 0
        self.held = False
        self.need = 0  # calls in flight its deadline needs (deadline_need); 0: none

    @property
    def behind(self):
        return self.calls < self.need


class OrgCaps:
    """Organizations' caps (Organization.max_concurrency, this engine's part), over every model."""

    def __init__(self):
        self.limits = {}  # organization id -> this engine's part of its cap (absent: no cap)
        self.calls = defaultdict(int)
        self.gates = []

    def allows(self, organization_id):
        limit = self.limits.get(organization_id)
        return limit is None or self.calls[organization_id] < limit

    def take(self, organization_id):
        self.calls[organization_id] += 1

    def give(self, organization_id):
        calls = self.calls[organization_id] - 1
        if calls:
            self.calls[organization_id] = calls
        else:
            del self.calls[organization_id]
        limit = self.limits.get(organization_id)
        if limit is not None and calls == limit - 1:
            # The organization was at its cap: its waiters on other models may go now.
            self.poke()

    def set_limits(self, limits):
        self.limits = limits
        self.poke()

    def poke(self):
        for gate in self.gates:
            if gate.waiting:
                gate.dispatch()


class CallGate:
    """One model's call slots in this engine, over its deployments, handed out fairly.

    `acquire` returns the deployment (an Upstream with `share`, `in_use`
    and `healthy`) the call is to use; `release` gives the slot back and
    hands it to the fairest waiter. A deployment out of the rotation
    (unhealthy) offers no slots; its calls in flight finish where they are.

    An organization with no call in flight on the model may send one past
    a deployment's adaptive limit (`_express_upstream`, EXPRESS_CALLS): the
    slots that free then pay the calls past it back before anyone's next.
    """

    def __init__(self, caps):
        self.caps = caps
        caps.gates.append(self)
        self.upstreams = []
        self.waiting = 0
        # expedited? -> organization id -> batch pk -> deque of (future, ticket, prefix key, first in line)
        self._queues: dict[bool, dict[int, dict[int, deque[tuple[Any, Ticket, int | None, bool]]]]] = {
            True: {},
            False: {},
        }
        self.org_calls = defaultdict(int)  # calls in flight on this model, by organization
        # When each organization was last given a slot (a count of grants): among those tied for the
        # fewest calls, the one served least recently goes next (`_fewest_calls`).
        self.org_served = {}
        self._grants = 0
        self.deadlines = {}  # batch pk -> Ticket of the batches with a need (deadline_need)
        # The seconds a call holds a slot, measured (Little's law: slot-seconds / calls finished); None: not yet.
        self.call_s = None
        self._flying, self._slot_s, self._finished, self._mark = 0, 0.0, 0, time.monotonic()

    @property
    def capacity(self):
        return sum(u.share for u in self.upstreams if u.healthy)

    @property
    def in_use(self):
        return sum(u.in_use for u in self.upstreams)

    @property
    def free(self):
        return sum(max(0, u.share - u.in_use) for u in self.upstreams if u.healthy)

    def _clock(self, started, finished):
        """Count slot-seconds as calls start and finish: every CALL_SAMPLE calls finished, a sample of
        the seconds a call holds its slot, averaged into call_s."""
        now = time.monotonic()
        self._slot_s += self._flying * (now - self._mark)
        self._mark = now
        self._flying += started - finished
        self._finished += finished
        if self._finished >= CALL_SAMPLE:
            sample = self._slot_s / self._finished
            self.call_s = sample if self.call_s is None else (self.call_s + sample) / 2
            self._slot_s, self._finished = 0.0, 0

    def close(self):
        if self in self.caps.gates:
            self.caps.gates.remove(self)

    def ready_waiting(self):
        """Calls waiting that could go now: those of organizations not at their cap."""
        if not self.waiting:
            return 0
        ready = 0
        for orgs in self._queues.values():
            for org, by_batch in orgs.items():
                if self.caps.allows(org):
                    ready += sum(len(queue) for queue in by_batch.values())
        return ready

    def _free_upstream(self, key=None):
        """The deployment `key` (a prompt prefix's, batches.engine.prefixes) prefers if it has room,
        else the healthy deployment with the most of its share free (by fraction, so calls spread
        over deployments in proportion to their concurrency)."""
        if len(self.upstreams) == 1:
            upstream = self.upstreams[0]
            return upstream if upstream.healthy and upstream.in_use < upstream.share else None
        if key is not None:
            home = prefixes.home_of(key, [u for u in self.upstreams if u.healthy and u.allotted > 0])
            if home is not None and home.in_use < home.share:
                return home
        best, room = None, 0.0
        for upstream in self.upstreams:
            if upstream.healthy and upstream.in_use < upstream.share:
                free = 1.0 - upstream.in_use / upstream.share
                if free > room:
                    best, room = upstream, free
        return best

    def _express_upstream(self, organization_id):
        """A healthy deployment the organization's call may go to past the adaptive limit, or None:
        it has no call in flight on this model (so one such call an organization at most), no batch
        with a deadline to meet runs here (`deadlines`), and the deployment has fewer than EXPRESS_CALLS past its
        limit, is under this engine's part of max_concurrency (the operator's ceiling) and has not
        refused one lately (`express_from`).

        Its calls past the limit are not the limit's: flow control does not learn from them
        (batches.engine.calls.caller.ModelCaller.call)."""
        if self.org_calls.get(organization_id) or not self.caps.allows(organization_id):
            return None
        if self.deadlines:
            # A batch with a deadline to meet runs here: the slots that free are paid to calls past
            # the limit first, so each would take one from it. Barred only while it was behind,
            # others' calls went past the limit whenever it reached its part (deadline_cap), and
            # under load (the limit shrunk under max_concurrency) it expired (issue 55, test_deadlines).
            return None
        best, past, now = None, EXPRESS_CALLS, None
        for upstream in self.upstreams:
            over = upstream.in_use - upstream.share
            if not upstream.healthy or over < 0 or over >= past or upstream.in_use >= upstream.allotted:
                continue
            now = time.monotonic() if now is None else now
            if now >= upstream.express_from:
                best, past = upstream, over
        return best

    async def acquire(self, ticket):
        key = prefixes.current_key.get()
        if ticket.need:
            self.deadlines[ticket.batch_pk] = ticket
        elif self.deadlines:
            self.deadlines.pop(ticket.batch_pk, None)
        if not self.waiting and self.caps.allows(ticket.organization_id):
            upstream = self._free_upstream(key) or self._express_upstream(ticket.organization_id)
            if upstream is not None:
                self._take(ticket, upstream)
                return upstream
        future = asyncio.get_running_loop().create_future()
        first = first_in_line.get()
        entry = (future, ticket, key, first)
        # get() first: setdefault would build a dict and a deque each call only to drop them.
        orgs = self._queues[ticket.expedited]
        by_org = orgs.get(ticket.organization_id)
        if by_org is None:
            by_org = orgs[ticket.organization_id] = {}
        queue = by_org.get(ticket.batch_pk)
        if queue is None:
            queue = by_org[ticket.batch_pk] = deque()
        if first:
            # Ahead of the batch's other calls, behind the dead engines' records already waiting:
            # they go out in line order, the order they were claimed in. appendleft sent them in
            # reverse, the lines really in flight last (issue 55: 12-15 s after a kill -9).
            at = 0
            while at < len(queue) and queue[at][3]:
                at += 1
            queue.insert(at, entry)
        else:
            queue.append(entry)
        self.waiting += 1
        if self._free_upstream() is not None or self._express_upstream(ticket.organization_id) is not None:
            # Room, but others wait (capped organizations, or the limit is full and this organization
            # has no call in flight): this waiter may be next.
            self.dispatch()
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(ticket, future.result())  # granted as we were cancelled: give it back
            else:
                self._forget(entry)
            raise

    def _forget(self, entry):
        ticket = entry[1]
        by_org = self._queues[ticket.expedited].get(ticket.organization_id, {})
        queue = by_org.get(ticket.batch_pk)
        if queue is not None and entry in queue:
            queue.remove(entry)
            self.waiting -= 1
            if not queue:
                del by_org[ticket.batch_pk]
                if not by_org:
                    del self._queues[ticket.expedited][ticket.organization_id]

    def release(self, ticket, upstream):
        self._clock(0, 1)
        upstream.in_use -= 1
        ticket.calls -= 1
        if self.deadlines and (not ticket.need or not ticket.calls and not self._queued(ticket)):
            # Its deadline no longer needs it first, or it has nothing here now (a batch that ran
            # out behind its deadline; its next call puts it back): `deadlines` holds only the
            # batches that have calls here, which calls past the limit wait for (_express_upstream).
            self.deadlines.pop(ticket.batch_pk, None)
        calls = self.org_calls[ticket.organization_id] - 1
        if calls:
            self.org_calls[ticket.organization_id] = calls
        else:
            del self.org_calls[ticket.organization_id]
            if not self._waits(ticket.organization_id):
                self.org_served.pop(ticket.organization_id, None)  # gone from this model: forget it
        self.caps.give(ticket.organization_id)
        if self.waiting:
            self.dispatch()

    def _queued(self, ticket):
        return ticket.batch_pk in self._queues[ticket.expedited].get(ticket.organization_id, ())

    def _waits(self, organization_id):
        return organization_id in self._queues[False] or organization_id in self._queues[True]

    def _take(self, ticket, upstream):
        self._clock(1, 0)
        upstream.in_use += 1
        ticket.calls += 1
        self.org_calls[ticket.organization_id] += 1
        self._grants += 1
        self.org_served[ticket.organization_id] = self._grants
        self.caps.take(ticket.organization_id)

    def dispatch(self):
        """Hand free slots to waiters in `turn` order: the organization with the fewest calls on this
        model (within its cap), then its expedited batches, then its batch with the fewest calls."""
        while self.waiting:
            if self._free_upstream() is not None:
                entry = self._next()
                if entry is None:
                    return  # every waiter's organization is at its cap
            else:
                entry = self._next_express()
                if entry is None:
                    return
            future, ticket, key, _ = entry
            if future.done():
                continue  # its task was cancelled; its own handler finds nothing left to forget
            upstream = self._free_upstream(key) or self._express_upstream(ticket.organization_id)
            self._take(ticket, upstream)
            future.set_result(upstream)

    def _next(self):
        """The next waiter by `turn`: a batch behind its deadline (`_most_behind`), else the organization
        first (`_fewest_calls`), then its batch."""
        return self._pop((self._most_behind() if self.deadlines else None) or self._fairest())

    def _next_express(self):
        """With the limit full: the next waiter by `turn` if its organization has no call in flight
        and a deployment has room past the limit (`_express_upstream`), else None."""
        org = self._fewest_calls(self._queues[True], self._queues[False])
        if org is None or self._express_upstream(org) is None:
            return None
        return self._pop(self._fairest(org))

    def _pop(self, best):
        if best is None:
            return None
        expedited, org, batch_pk = best
        orgs = self._queues[expedited]
        by_batch = orgs[org]
        queue = by_batch[batch_pk]
        entry = queue.popleft()
        self.waiting -= 1
        if not queue:
            del by_batch[batch_pk]
            if not by_batch:
                del orgs[org]
        return entry

    def _fairest(self, org=None):
        """(expedited, organization, batch pk) of the next waiter by `turn` without deadlines (of `org`'s
        batches if given)."""
        if org is None:
            org = self._fewest_calls(self._queues[True], self._queues[False])
        if org is None:
            return None
        best, best_turn = None, None
        for expedited in (True, False):
            for batch_pk, queue in self._queues[expedited].get(org, {}).items():
                key = turn(0, expedited, queue[0][1].calls)
                if best_turn is None or key < best_turn:
                    best, best_turn = (expedited, org, batch_pk), key
        return best

    def _most_behind(self):
        """(expedited, organization, batch pk) of the waiting batch furthest below its deadline's need
        (by the share of it missing), or None: none is, or those that are hold DEADLINE_MAX_SHARE of
        the model already (the others keep progressing)."""
        held = sum(min(t.calls, t.need) for t in self.deadlines.values())
        if held >= deadline_cap(self.capacity):
            return None
        best, most = None, 0.0
        for ticket in self.deadlines.values():
            if not ticket.behind or not self.caps.allows(ticket.organization_id):
                continue
            queue = self._queues[ticket.expedited].get(ticket.organization_id, {}).get(ticket.batch_pk)
            missing = 1 - ticket.calls / ticket.need
            if queue and missing > most:
                best, most = (ticket.expedited, ticket.organization_id, ticket.batch_pk), missing
        return best

    def _fewest_calls(self, *waiting):
        """The waiting organization (not at its cap) with the fewest calls in flight on this model, or
        None: `turn`'s first key. Ties go to the one served least recently, so organizations tied for
        one free slot take turns: by the dicts' order, the first kept every slot (issue 55: another
        sent nothing for 12 s beside a deadline batch holding the rest of the model).

        A plain loop: this runs on every slot's release, and with one
        organization waiting (the common case) it is a lookup or two.
        """
        allows, calls, served = self.caps.allows, self.org_calls, self.org_served
        best, fewest, best_served = None, None, 0
        for orgs in waiting:
            for org in orgs:
                if not allows(org):
                    continue
                n = calls.get(org, 0)
                if fewest is None or n < fewest:
                    best, fewest, best_served = org, n, served.get(org, 0)
                elif n == fewest and (last := served.get(org, 0)) < best_served:
                    best, best_served = org, last
        return best
