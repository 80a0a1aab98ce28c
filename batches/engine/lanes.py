"""Which record starts: lanes, their batches' claimed records, and the slots that run them.

A lane is one model in this engine: its caller (the model's gate and
deployments), the batches of that model this engine works (`BatchRun`) and
its slot coroutines. A slot takes the next record (`Lane.pick`: the order of
batches.engine.fairness), runs it through its loop
(batches.engine.loops.dispatch) and leaves the outcome for the next flush
(batches.engine.trips), then takes the next record itself: no Task per
record; new slots start only when records arrive faster than slots free.
"""

import asyncio
import functools
import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import orjson

from batches.engine import checkpoints, prefixes
from batches.engine.calls import budget
from batches.engine.context import BatchCaller, RecordContext
from batches.engine.fairness import Held, OrgCaps, Ticket, deadline_cap, place_record, turn
from batches.engine.loops import dispatch
from batches.engine.outcomes import RecordOutcome
from batches.engine.spend import Guard
from batches.engine.store import ClaimedRecord
from batches.engine.trips import FLUSH_EVERY_S, FLUSH_SIZE, SentMarks
from batches.models import BatchStatus, Priority
from batches.validation.contracts import batch_contract
from openrelay.lib import logs

logger = logging.getLogger("openrelay.engine")

PREFETCH_S = 0.25
MIN_PREFETCH = 16
# Records a lane keeps running per call slot: a tool-calling or workflow
# record spends part of its life waiting for the user's server, not the model.
RECORDS_PER_SLOT = 4


class BatchRun:
    """One batch as this engine works it: claimed records waiting, counts, the input file."""

    def __init__(self, row, lane, outbound, checkpoint_writer=None, spend=None, checkers=None):
        self.pk = row["pk"]
        self.public_id = row["public_id"]
        self.organization_id = row["organization_id"]
        self.expedited = row["priority"] == Priority.EXPEDITED
        self.expires_at = row["expires_at"]
        self.input_file_id = row["input_file_id"]
        self.status = row["status"]
        self.lane = lane
        self.ticket = Ticket(self.pk, self.organization_id, self.expedited)
        self.ctx = RecordContext(
            batch_pk=self.pk,
            batch_public_id=self.public_id,
            organization_id=self.organization_id,
            endpoint=row["endpoint"],
            model_name=row["model_name"],
            caller=BatchCaller(lane.caller, self.ticket, spend),
            workflows_enabled=row["organization__workflows_enabled"],
            outbound=outbound,
            checkpoints=checkpoint_writer,
            output_contract=batch_contract(row["output_contract"]),
            checkers=checkers,
        )
        self.spend = spend  # its guardrails here (batches.engine.spend); None: none
        self.input = None
        self.queue = prefixes.RecordQueue()  # claimed (ClaimedRecord, line bytes), not started yet
        self.done = []  # (ClaimedRecord, RecordOutcome) waiting for a flush
        self.holdings = []  # the answer bytes those hold (budget.Holding), given back once flushed
        self.cursor = 0  # the last line claimed: claims continue past it
        self.recheck_at = 0.0  # while > now, nothing is left to claim
        self.expired_check_at = 0.0  # when to look for dead engines' records again
        self.resume = 0  # records a dead engine left here that this engine freed: claim them now
        self.resumed_queued = 0  # of those, claimed and waiting here: they start without waiting for room
        self.active = 0
        self.served = 0  # records started here: the tie-break between an organization's batches
        self.started = 0
        self.rate_mark = (time.monotonic(), 0)
        self.target = min(MIN_PREFETCH, max(1, lane.gate.capacity))
        self.closing = False
        self.shared_prefixes = False  # its claims showed records sharing a prompt prefix
        self.last_event = 0.0
        self.sampled_at = -math.inf  # when this engine last took a progress sample of the batch

    @property
    def workable(self):
        paused = self.spend is not None and self.spend.paused
        return self.status == BatchStatus.IN_PROGRESS and not self.closing and not paused

    def adapt(self, now, hop_s):
        """Size the claim-ahead from the batch's recent start rate and the database's round trip:
        enough to start records through two trips, at least MIN_PREFETCH (or the lane's capacity)."""
        since, started = self.rate_mark
        if now - since < 0.05:
            return
        rate = (self.started - started) / (now - since)
        floor = min(MIN_PREFETCH, max(1, self.lane.gate.capacity))
        config = self.lane.config
        self.target = max(floor, min(config.claim_chunk, math.ceil(rate * (2 * hop_s + PREFETCH_S))))
        if self.shared_prefixes:
            # Enough claimed ahead that records sharing a prefix wait here together (batches.engine.prefixes).
            self.target = max(self.target, config.prefix_window)
        self.rate_mark = (now, self.started)

    def hand_back(self):
        """Forget every record claimed here and not started (held, in doubt, stopping). Returns
        their pks, for the engine to give back to pending."""
        pks = [record.pk for record, _ in self.queue]
        self.queue.clear()
        self.resumed_queued = 0
        return pks


class Lane:
    """One model in this engine: its caller (gate and deployments), its batches, its slots."""

    def __init__(self, model_id, caller, config):
        self.model_id = model_id
        self.caller = caller
        self.config = config
        self.gate = caller.gate
        self.batches = {}
        self.slots = set()
        self.active = 0
        self.org_active = defaultdict(int)
        self.upstreams = {}  # deployment pk -> Upstream
        self.rows = []  # the catalog's rows they were made from
        self.retired = []  # replaced Upstreams still carrying calls

    def room_for(self, run, caps):
        """May a record of `run` start now?

        The model is kept busy with a short line of ready calls at its gate
        (`margin`); records waiting for their user's server don't count
        against it, up to RECORDS_PER_SLOT records a slot. An organization
        below its fair part of that may always start one, so another
        organization's slow tools or full line never hold it back.
        """
        gate = self.gate
        capacity = gate.capacity
        if capacity <= 0:
            return False
        if run.resumed_queued:
            return True  # a dead engine's record: to the head of the gate's line (liveness)
        org = run.organization_id
        limit = caps.limits.get(org)
        if limit is not None and self.org_active[org] >= limit * RECORDS_PER_SLOT:
            return False
        bound = capacity * RECORDS_PER_SLOT
        margin = max(4, capacity // 4)
        if gate.ready_waiting() < gate.free + margin and self.active < bound:
            return True
        organizations = {r.organization_id for r in self.batches.values() if r.queue or r.active}
        return self.org_active[org] < bound / max(1, len(organizations))

    def pick(self, caps):
        """The batch whose queued record starts next, or None: the first by fairness.turn, counting
        records running here (the gate counts calls in flight), if it has room to start one. A batch
        behind its deadline is, up to its need, while those together hold less than deadline_cap."""
        best, best_key = None, None
        held = sum(min(run.active, run.ticket.need) for run in self.batches.values())
        deadlines_room = held < deadline_cap(self.gate.capacity)
        for run in self.batches.values():
            if not run.queue or not run.workable:
                continue
            behind = deadlines_room and run.active < run.ticket.need
            key = turn(self.org_active[run.organization_id], run.expedited, run.active, run.served, behind)
            if best_key is None or key < best_key:
                best, best_key = run, key
        if best is None or not self.room_for(best, caps):
            return None
        return best


class Lanes:
    """The Engine's slots (a part of runner.Engine): start records on each lane, run them one after another.

    It owns what runs (`running`), the outcomes waiting for a flush (`pending`, on each BatchRun's
    `done`) and the records its slots give back (`take_handback`). What a slot needs below it
    travels in the slot's own context, not in arguments: the answer bytes it holds
    (budget.current), the cost of its calls (spend.current_tab) and its prompt prefix and place
    in line (fairness.place_record). Those are read at the call seam, under the record's loop
    (dispatch, toolloop, workflow, contract) and its caller; passing them down would put three
    arguments on every function of every loop for values only the seam reads.
    """

    def __init__(
        self,
        caps: OrgCaps,
        guard: Guard,
        answers: budget.Budget,
        wake: Callable[[], None],
        leased: Callable[[], bool],
        marks: SentMarks,
    ) -> None:
        self.marks = marks  # a record is marked sent before its first call goes out (trips.SentMarks)
        self.caps = caps  # the organizations' caps (peers.Peers sets them)
        self.leased = leased  # whether the engine's leases hold (leases.Leases.live): no record starts without
        self.guard = guard
        self.answers = answers  # the answer bytes this engine may hold (budget.Budget)
        self.wake = wake  # ends the loop's sleep (runner.Engine._wake)
        self.running: dict[asyncio.Task[Any], tuple[BatchRun, ClaimedRecord]] = {}  # slot task -> what it runs now
        self.pending = 0  # finished records waiting for a flush, over every batch
        self.flush_soon = False  # a batch ran out of records here: write its last ones now
        self.handback: list[int] = []  # records its slots give back unfinished (held, or stopping)
        self.stopping = False  # stopping: a slot takes no next record

    def start_slots(self, lanes: Iterable[Lane]) -> None:
        """Start records on each lane while it has room, each in a new slot coroutine.

        A slot works records one after another (no Task per record), picking
        the next one fairly itself; new slots are only needed when records
        arrive faster than the running ones finish. None while the engine's leases are in
        doubt (batches.engine.leases): other engines may soon run its records.
        """
        if not self.leased():
            return
        loop = asyncio.get_running_loop()
        for lane in lanes:
            while (run := lane.pick(self.caps)) is not None:
                task = loop.create_task(self._slot(lane, self._begin(run)))
                lane.slots.add(task)
                task.add_done_callback(lane.slots.discard)

    def cancel(self, run: BatchRun) -> None:
        """Stop `run`'s records running here (their batch is closing: whoever closes it marks them)."""
        for task, (owner_run, _) in list(self.running.items()):
            if owner_run is run:
                task.cancel()

    def cancel_stuck(self, now: float, deadline: float) -> None:
        """While stopping: records still waiting for a model that has no healthy deployment
        are handed back at once; after `deadline`, every record still running is."""
        for task, (run, _) in list(self.running.items()):
            if now >= deadline or run.lane.gate.capacity <= 0:
                task.cancel()

    def stop(self) -> None:
        self.stopping = True

    def take_handback(self) -> list[int]:
        pks, self.handback = self.handback, []
        return pks

    def flush_due(self, now: float, last_flush: float) -> bool:
        return bool(self.pending) and (
            self.flush_soon or self.pending >= FLUSH_SIZE or now - last_flush >= FLUSH_EVERY_S
        )

    def take_outcomes(self, runs: Iterable[BatchRun]) -> tuple[dict[int, list[Any]], dict[int, list[budget.Holding]]]:
        """The outcomes waiting for a flush ({batch pk: [(record, outcome)]}) and the answer bytes they
        hold ({batch pk: [holding]})."""
        outcomes, holdings = {}, {}
        for run in runs:
            if run.done:
                outcomes[run.pk], run.done = run.done, []
                holdings[run.pk], run.holdings = run.holdings, []
        self.pending = 0
        self.flush_soon = False
        return outcomes, holdings

    def _begin(self, run):
        """Take `run`'s next queued record and count it running (before its slot even starts,
        so the next pick sees it)."""
        record, raw = run.queue.popleft()
        if record.resumed and run.resumed_queued:
            run.resumed_queued -= 1
        lane = run.lane
        run.active += 1
        run.served += 1
        run.started += 1
        lane.active += 1
        lane.org_active[run.organization_id] += 1
        return run, record, raw

    async def _slot(self, lane, first):
        task = asyncio.current_task()
        assert task is not None  # a slot is a task of its own (start_slots)
        work = first
        while work is not None:
            run, record, raw = work
            self.running[task] = (run, record)
            place_record(record.prefix, record.resumed, functools.partial(self.marks.mark, run, record))
            bound = logs.working_on(run.public_id, run.pk, record.line)
            holding = budget.Holding(self.answers)
            budget.current.set(holding)  # the slot's own context: its calls take answer bytes into it
            tab = self.guard.begin(run.spend, record.twins)  # and their cost into its tab
            try:
                outcome = await self._execute(run, record, raw)
            except Held:
                outcome = None  # its batch paused before its call went out: pending again, unsent
                holding.release()
                self.handback.append(record.pk)
            except asyncio.CancelledError:
                holding.release()
                if not run.closing:
                    self.handback.append(record.pk)  # stopping: back to pending for any engine
                raise
            except Exception as exc:  # noqa: BLE001 - a crash fails its record, not the engine
                logger.error("record %s of %s crashed: %r", record.line, run.public_id, exc)
                outcome = RecordOutcome.error("internal_error", "The record failed inside the worker.")
            finally:
                del self.running[task]
                self._end(run)
                logs.done(bound)
            if run.spend is not None:
                self.guard.record_ended(run.spend, record, tab, outcome)
            if outcome is not None:
                run.done.append((record, outcome))
                run.holdings.append(holding)
                self.pending += 1
            if (not run.queue and not run.active) or self.answers.waiting:
                # Perhaps the batch's last records (closing waits on them), or answers wait for
                # the room this flush gives back.
                self.flush_soon = True
            if self.pending >= FLUSH_SIZE or len(run.queue) <= run.target // 2:
                self.wake()
            work = None
            if not self.stopping and self.leased() and (next_run := lane.pick(self.caps)) is not None:
                work = self._begin(next_run)
        self.wake()

    @staticmethod
    def _end(run):
        lane, org = run.lane, run.organization_id
        run.active -= 1
        lane.active -= 1
        lane.org_active[org] -= 1
        if not lane.org_active[org]:
            del lane.org_active[org]

    async def _execute(self, run, record, raw):
        try:
            body = orjson.loads(raw)["body"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return RecordOutcome.error("invalid_json_line", "The input line could no longer be read as JSON.")
        try:
            return await dispatch.run_record(run.ctx, record, body)
        except checkpoints.LeaseLost:
            # Not ours any more: the flush skips this outcome (conditional on the lease).
            return RecordOutcome.error("lease_lost", "The record's lease was lost.")
