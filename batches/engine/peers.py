"""What this engine holds among the others: heartbeat, shares, deployments and their health.

Every live engine may claim any record, so each takes a part of every
shared limit: a deployment's max_concurrency and an organization's cap are
split over the live engines by rank (batches.engine.fairness.split). The
heartbeat (every HEARTBEAT_S) publishes what this engine holds and its
figures (batches.engine.calls.flow.Figures), learns who else is alive, takes
over what dead engines left (batches.engine.liveness) and re-splits the
shares; `_reconcile` brings each lane's deployments in line with the
catalog; a deployment another engine found failing is taken out here too
(`_adopt_health`), and one this engine finds failing is saved for the others
(`_health_changed`).
"""

import asyncio
import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Coroutine
from typing import Any

from django.utils import timezone

from batches import tallies
from batches.engine import store
from batches.engine.calls import flow
from batches.engine.calls.caller import ModelCaller, Upstream
from batches.engine.calls.health import Health
from batches.engine.config import EngineConfig
from batches.engine.fairness import CallGate, OrgCaps, split
from batches.engine.fence import StatusFence
from batches.engine.lanes import Lane
from batches.engine.liveness import Liveness
from openrelay.core.models import DeploymentHealth

logger = logging.getLogger("openrelay.engine")

HEARTBEAT_S = 0.5  # how often engines count each other and publish what they hold
REFUSAL_NEWS_S = 5.0  # another engine's refusal older than this when heard is no news
DEPLOYMENTS_EVERY_S = 2.0  # how often the lanes re-read their deployments from the catalog


class Peers:
    """The Engine among the other engines (a part of runner.Engine).

    It owns the lanes (one a model: its caller, gate and deployments), the organizations' caps
    (`caps`, split over the live engines), the deployments' health, this engine's place among
    the live ones (`rank`, `engines`), and what dead engines left (`take_freed`).
    """

    def __init__(
        self,
        config: EngineConfig,
        owner: str,
        liveness: Liveness,
        caps: OrgCaps,
        db: Callable[..., Coroutine[Any, Any, Any]],
        wake: Callable[[], None],
        leased: Callable[[], bool],
        fence: StatusFence | None = None,
    ) -> None:
        self.config = config
        self.fence = fence  # when the engine last read the running batches (fence.py): each caller checks it
        self.leased = leased  # whether the engine's leases hold (leases.Leases.live): each caller checks it
        self.owner = owner
        self.liveness = liveness
        self.caps = caps  # the organizations' caps, this engine's part of each (the lanes and trips read them)
        self.db = db  # a call on the engine's database thread (runner.Engine.db)
        self.wake = wake  # ends the loop's sleep (runner.Engine._wake)
        self.lanes: dict[int, Lane] = {}  # model pk -> its lane
        self.health = Health(on_change=self._health_changed, on_recovered=wake)
        self.rank, self.engines = 0, 1  # this engine's place among the live engines, and how many are live
        self.others_holding: dict[int, int] = {}  # deployment pk -> calls the other live engines hold there
        self.beaten = False  # its first heartbeat creates its row; later ones find it (or were fenced)
        self.resuming = False  # engines left (dead, or stopped): claim what they left before taking their shares
        self.freed: dict[int, int] = {}  # batch pk -> sent records dead engines left, not yet handed on (take_freed)
        self.others: set[str] = set()  # the other live engines, as the last beat found them
        self.absorbing: defaultdict[int, int] = defaultdict(int)  # deployment pk -> calls of engines gone, ours now
        self.told: dict[int, float] = {}  # deployment pk -> when a server there last refused us after none had
        self.tell_refusals = False  # `told` changed since it was saved for the others
        self.hear_refusals = False  # another engine was refused a call (runner.Engine._watch)
        self.heard: dict[int, float] = {}  # deployment pk -> the latest refusal of another engine acted on

    def set_caps(self, rows):
        """The organizations' caps of the batches the poll read (`rows`), this engine's part of each."""
        caps = {}
        for row in rows:
            cap = row["organization__max_concurrency"]
            if cap:
                caps[row["organization_id"]] = split(cap, self.rank, self.engines)
        if caps != self.caps.limits:
            self.caps.set_limits(caps)

    async def lane_for(self, model_id):
        """The model's lane, opened if this engine has none yet."""
        lane = self.lanes.get(model_id)
        if lane is None:
            lane = await self._open_lane(model_id)
        return lane

    async def _open_lane(self, model_id):
        caller = ModelCaller(
            [],
            time_limit_s=self.config.call_time_limit_s,
            retries=self.config.upstream_retries,
            idle_timeout_s=self.config.idle_timeout_s,
            gate=CallGate(self.caps),
            health=self.health,
            leased=self.leased,
            fence=self.fence,
        )
        await caller.__aenter__()
        lane = self.lanes[model_id] = Lane(model_id, caller, self.config)
        self._reconcile(lane, (await self.db(store.deployments, [model_id])).get(model_id, []))
        await self.heartbeat()  # publish what it will hold of the new deployments, then take it
        return lane

    async def refresh_deployments(self):
        if not self.lanes:
            return
        rows = await self.db(store.deployments, list(self.lanes))
        for model_id, lane in list(self.lanes.items()):
            if not lane.batches and not lane.active:
                await lane.caller.__aexit__(None, None, None)
                lane.gate.close()
                del self.lanes[model_id]
                continue
            self._reconcile(lane, rows.get(model_id, []))

    def _reconcile(self, lane, rows):
        """Bring the lane's deployments in line with the catalog: new ones join, changed ones are
        replaced, removed or disabled ones retire once their calls end; every share is re-split."""
        lane.rows = rows
        current = {}
        for index, row in enumerate(rows):
            upstream = lane.upstreams.get(row["pk"])
            settings_now = (row["base_url"], row["upstream_model"] or row["model__name"], row["api_key"])
            if upstream is None or upstream.settings != (*settings_now, row["messages_api"]):
                if upstream is not None:
                    self._retire(lane, upstream)
                upstream = Upstream(
                    *settings_now,
                    row["max_concurrency"],
                    deployment_id=row["pk"],
                    config=self.config,
                    messages_api=row["messages_api"],
                    # The start is the deployment's, not each engine's: two engines starting at
                    # 16 each sent 32, a 16-slot server's whole queue (issue 55).
                    start=max(1, split(self.config.concurrency_start, self.rank + index, self.engines)),
                )
                upstream.on_refused = self.refused
                if time.time() - self.heard.get(row["pk"], -math.inf) <= REFUSAL_NEWS_S:
                    # Another engine was refused there just before this one opened the deployment:
                    # it joins held, not in slow start. Heard before it had a lane, the refusal held
                    # nothing, and an engine that opened its lane 0.3 s after the others' burst sent
                    # its start into the full server: its own refusal and three of another engine's,
                    # whose slots it took (row 18).
                    upstream.peer_refused()
            upstream.concurrency = max(1, row["max_concurrency"])
            # Offset by the deployment's place, so the engines that take one slot more
            # are not the same ones on every deployment; never more than the others
            # leave (a joining engine waits for them to shrink to their new parts).
            # An engine publishes its part (heartbeat's `holding`) before it takes it.
            upstream.part = split(upstream.concurrency, self.rank + index, self.engines)
            left = upstream.concurrency - self.others_holding.get(row["pk"], 0)
            upstream.allot(max(0, min(upstream.part, left)) if upstream.published else 0)
            self._adopt_health(lane, upstream, row)
            current[row["pk"]] = upstream
        for pk, upstream in lane.upstreams.items():
            if pk not in current and upstream not in lane.retired:
                self._retire(lane, upstream)
        lane.upstreams = current
        lane.gate.upstreams = list(current.values()) + [u for u in lane.retired if u.in_use]
        for upstream in [u for u in lane.retired if not u.in_use]:
            upstream.close()
            lane.retired.remove(upstream)
        lane.gate.dispatch()
        self.wake()

    def _retire(self, lane, upstream):
        self.health.forget(upstream)
        upstream.healthy = False  # no new calls; those in flight finish
        upstream.allot(0)
        lane.retired.append(upstream)

    def _adopt_health(self, lane, upstream, row):
        """Another engine found the deployment failing after we last heard of it: take it out too
        (and probe it, or send it canaries, ourselves) rather than send it calls that will fail.
        The row's health_changed_at is exactly the time this engine last wrote there
        (_health_changed), so its own change never reads as another engine's."""
        changed = row["health_changed_at"]
        if (
            row["health"] == DeploymentHealth.UNHEALTHY
            and upstream.healthy
            and changed is not None
            and (upstream.health_seen_at is None or changed > upstream.health_seen_at)
        ):
            self.health.adopt(lane.gate, upstream, row["last_error"], row["needs_canary"])
        upstream.health_seen_at = max(filter(None, (changed, upstream.health_seen_at)), default=None)

    def _health_changed(self, upstream):
        upstream.health_seen_at = timezone.now()
        if upstream.deployment_id is None:
            return
        state = DeploymentHealth.HEALTHY if upstream.healthy else DeploymentHealth.UNHEALTHY
        asyncio.get_running_loop().create_task(
            self.db(
                store.save_health,
                upstream.deployment_id,
                state,
                upstream.health_seen_at,
                upstream.last_error,
                upstream.canary and not upstream.healthy,
            )
        )

    async def heartbeat(self):
        upstreams = [u for lane in self.lanes.values() for u in lane.gate.upstreams if u.deployment_id is not None]
        holding = {str(u.deployment_id): max(u.part, u.share, u.in_use) for u in upstreams}
        try:
            live, freed, _ = await self.db(self.liveness.beat, holding, not self.beaten)
        except store.Fenced:
            logger.error("engine %s was taken for dead and its records taken over; starting again", self.owner)
            raise
        self.beaten = True
        self._freed(freed)
        await self.db(tallies.publish, self.owner, tallies.take(upstreams))
        for upstream in upstreams:
            upstream.published = True
        owners = [owner for owner, _, _ in live]
        self.rank = owners.index(self.owner) if self.owner in owners else 0
        self.engines = max(1, len(owners))
        # An engine gone since the last beat, reaped here or by another: claim this engine's part of what it left.
        gone = self.others - set(owners)
        self.others = set(owners) - {self.owner}
        self.resuming = self.resuming or bool(freed) or bool(gone)
        others: defaultdict[int, int] = defaultdict(int)
        for owner, held, _ in live:
            if owner != self.owner:
                for deployment, calls in held.items():
                    others[int(deployment)] += calls
        self.others_holding = others
        limits = flow.peer_limits(live, self.owner)
        for upstream in upstreams:
            if limits.get(upstream.deployment_id):
                upstream.level_with(limits[upstream.deployment_id])
        if not self.resuming:
            self.reshare()

    def reshare(self):
        """Split every lane's deployments again (after a heartbeat, or a take-over: runner.Engine._take_over,
        which this ends); the calls of engines gone that this engine took over join its adaptive limits."""
        self.resuming = False
        absorbing, self.absorbing = self.absorbing, defaultdict(int)
        for lane in self.lanes.values():
            self._reconcile(lane, lane.rows)
            for upstream in lane.upstreams.values():
                if absorbing.get(upstream.deployment_id):
                    upstream.absorb(absorbing[upstream.deployment_id])  # within the new part, set just now
            lane.gate.dispatch()

    def refused(self, upstream):
        """A server refused this engine a call (a 503) where none had for a hold (flow.FlowControl):
        the others hear it at once (`share_refusals`, their watch) and stop slow start there. Each
        engine found the server's edge on its own before, and one still doubling took the room the
        refused ones gave back: 17 refusals in its burst, 38 in all, where the 503s should be a few
        (issue 55, four engines on a 16-slot server without a queue)."""
        if upstream.deployment_id is not None:
            self.told[upstream.deployment_id] = time.time()
            self.tell_refusals = True
            self.wake()

    async def share_refusals(self):
        """Save this engine's refusals for the others (their watch reads `Engine.refused_at`), and
        act on theirs: every upstream of a deployment another engine was refused at since stops
        slow start, with no more calls than it has in flight (flow.FlowControl.peer_refused)."""
        if self.tell_refusals:
            self.tell_refusals = False
            await self.db(store.tell_refused, self.owner, dict(self.told))
        if not self.hear_refusals:
            return
        self.hear_refusals = False
        now = time.time()
        for pk, when in (await self.db(store.refusals, self.owner)).items():
            if when <= self.heard.get(pk, 0.0) or now - when > REFUSAL_NEWS_S:
                continue
            self.heard[pk] = when
            for lane in self.lanes.values():
                for upstream in lane.gate.upstreams:
                    if upstream.deployment_id == pk:
                        upstream.peer_refused()

    def free_calls(self, lane):
        """The calls this engine will have free on `lane` once the shares are split again (a take-over
        ends with it: runner.Engine._take_over): its new parts less its calls in flight."""
        free = 0
        for index, row in enumerate(lane.rows):
            upstream = lane.upstreams.get(row["pk"])
            if upstream is not None and upstream.healthy:
                free += max(0, split(upstream.concurrency, self.rank + index, self.engines) - upstream.in_use)
        return free

    def took_over(self, lane, calls):
        """This engine claimed `calls` records of `lane` that engines gone had in flight: their calls are
        this engine's now, on top of its own (flow.FlowControl.absorb, at `reshare`, within the new
        parts). Left to grow back by answers, a survivor sent them one call round at a time; the
        reaper absorbing all the dead engines held had its ceiling cut them to its own part."""
        healthy = [u for u in lane.upstreams.values() if u.healthy and u.deployment_id is not None]
        for index, upstream in enumerate(healthy):
            self.absorbing[upstream.deployment_id] += split(calls, index, len(healthy))

    def _freed(self, freed):
        """Dead engines left records of our batches ({batch pk: records freed}): claim them at once."""
        for pk, n in freed.items():
            self.freed[pk] = self.freed.get(pk, 0) + n
        if freed:
            logger.info("took over %s records of dead engines", sum(freed.values()))
            self.wake()

    def take_freed(self):
        """{batch pk: records freed} since the last call, for the batches to claim (batch_set.Roster.resume)."""
        freed, self.freed = self.freed, {}
        return freed

    async def close(self):
        for lane in self.lanes.values():
            await lane.caller.__aexit__(None, None, None)
            lane.gate.close()
        await self.health.close()
