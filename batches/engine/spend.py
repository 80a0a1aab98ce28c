"""The guardrails as an engine keeps them: spend caps and budgets at the call seam, and the Guard
that pauses a batch for them or for its error breaker (batches.engine.breaker judges the failures;
batches.guardrails has the rules and the owner's side).

Before a call of a capped batch (or of an organization with a
monthly budget) goes out, its worst case is reserved against what is left:
its prompt's bytes (a token is at least a byte) at the input price, plus the
answer tokens it may draw (the request's max_tokens, else the model's
max_output_tokens, else OPENRELAY_DEFAULT_MAX_OUTPUT_TOKENS, times `n`) at the
output price. When it does not fit, the call waits for this engine's calls
in flight to settle (their real cost is known then, and is usually far below
the worst case); with none left in flight, the batch pauses and the record
goes back to pending (`Held`), unsent. So with one engine a batch never
passes its cap. With several, each reserves against its part of what is left (split
between the live engines, as they split a deployment's concurrency): each knows what the
database says was spent, and its own calls, so together they stay within it up to the
moments their reads of the database lag (a poll, 0.2 s).

What was spent is counted from three places that never overlap: the database
(read each poll: every flushed record), what this engine flushed since that
read, and what its calls came to since. Every answer counts, billed or not:
a record that ends swaps its calls' cost for what it is billed plus what it
got unbilled (a tool-calling record that failed mid-loop bills nothing, but
its turns' tokens are its outcome's `unbilled` usage), and the database's
figure is the batch's billed and unbilled counters at its prices. Before
issue 56 unbilled turns were forgotten as their record ended: 60 records
whose executor always failed each made a 1,000,000-nano turn under a
10,000,000-nano cap and all ran.
"""

import asyncio
import contextvars
import functools
import logging
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any, Protocol

import orjson
from django.conf import settings

from batches import guardrails, lifecycle, reuse
from batches.engine import breaker
from batches.engine.fairness import Held
from batches.models import Batch, PauseReason
from billing.pricing import NANOS_PER_USD, Prices, cost

logger = logging.getLogger("openrelay.engine")

# A record's calls add their cost to its tab (the slot's context, like budget.current).
current_tab = contextvars.ContextVar("guardrail_tab", default=None)
ANSWER_LIMITS = ("max_completion_tokens", "max_tokens", "max_output_tokens")


class Tab:
    """What one record's calls came to, so far (nano-dollars), and what its end will bill per nano
    of them: `permille` 1000, or more for a leader whose twins each bill a share of its answer
    (batches.reuse, OPENRELAY_REUSE_BILL_SHARE), written by the same flush."""

    def __init__(self, spend, permille=1000):
        self.spend = spend
        self.nanos = 0
        self.permille = permille

    def weigh(self, nanos):
        return nanos * self.permille // 1000


class OrgSpend:
    """An organization's monthly budget as this engine sees it: the database's figure at the
    last read, plus what this engine's calls added since."""

    def __init__(self, organization_id):
        self.organization_id = organization_id
        self.budget = None  # nanos, or None: no budget
        self.db = 0
        self.local = 0  # flushed since the read, records ended unflushed, calls answered in open records
        self.reserved = 0
        self.settled = asyncio.Event()
        self.read_at = -1e9

    def fits(self, worst, engines):
        if self.budget is None:
            return True
        return self.local + self.reserved + worst <= (self.budget - self.db) // engines


class BatchSpend:
    """One batch's cap and spend in this engine, and its reservations at the call seam."""

    def __init__(self, guard, row, org):
        self.guard = guard
        self.pk = row["pk"]
        self.org = org
        self.model_cap = None
        self.db = 0
        self.flushed = 0
        self.pending = 0  # records ended here, not yet flushed
        self.answered = 0  # calls answered for records still running here
        self.reserved = 0
        self.in_flight = 0
        self.settled = asyncio.Event()
        self.paused = False
        self.pausing = False  # this engine is writing the pause: a poll read before it must not undo it
        self.update(row)

    def update(self, row):
        self.cap = row["max_cost_nanos"]
        self.prices = Prices(
            row["price_input"], row["price_cached_input"], row["price_output"], row["price_multiplier"]
        )
        self.db = _cost(self.prices, row["input_tokens"], row["cached_tokens"], row["output_tokens"]) + _cost(
            self.prices, row["unbilled_input_tokens"], row["unbilled_cached_tokens"], row["unbilled_output_tokens"]
        )
        self.flushed = 0
        self.paused = row["paused_at"] is not None or self.pausing
        self.breaker = guardrails.Breaker(row["breaker_window"], row["breaker_failures"], row["breaker_consecutive"])
        self.model_cap = row["model__max_output_tokens"]

    @property
    def guarded(self):
        return self.cap is not None or self.org.budget is not None

    @property
    def unread(self):
        """What this engine's finished records cost that the database's figure does not hold yet."""
        return self.flushed + self.pending

    @property
    def spent(self):
        return self.db + self.flushed + self.pending + self.answered

    def fits(self, worst, engines):
        """Does the call fit this engine's part of what is left: what the database says is left, split
        between the live engines (each knows only its own calls), less what this engine added since?"""
        if self.cap is None:
            return True
        return self.flushed + self.pending + self.answered + self.reserved + worst <= (self.cap - self.db) // engines

    async def reserve(self, body):
        """Reserve the call's worst case; wait while this engine's calls in flight may free room;
        pause the batch (and raise Held) when none can."""
        if self.paused:
            raise Held
        if not self.guarded:
            return None
        worst = self.worst_case(body)
        tab = current_tab.get()
        if tab is not None and tab.spend is self:
            worst = tab.weigh(worst)  # a leader's call may also bill its twins' shares
        while self.org.budget is not None and self.org.read_at < 0:
            await self.org.settled.wait()  # what the organization spent is read on the engine's next poll
            if self.paused:
                raise Held
        while not (self.fits(worst, self.guard.engines) and self.org.fits(worst, self.guard.engines)):
            capped = not self.fits(worst, self.guard.engines)
            if capped and not self.in_flight and not self.unread:
                await self.guard.pause(self, PauseReason.SPEND_CAP, self._cap_detail(worst))
            elif not capped and not self.org.reserved and not self.guard.unread(self.org):
                await self.guard.pause_organization(self.org, self._budget_detail())
            else:
                # Calls in flight may settle below their worst case, and what this engine spent since
                # the database was last read moves into the database's figure at the next read: either
                # may leave room (this engine's part of what is left is then figured again).
                waiting = self.settled if capped else self.org.settled
                await waiting.wait()
            if self.paused:
                raise Held
        self.reserved += worst
        self.org.reserved += worst
        self.in_flight += 1
        return worst

    def settle(self, worst, usage):
        """The call came back (`usage` None: it was cut): its reservation gives way to its cost."""
        if worst is None:
            return  # not reserved: the batch had no cap nor its organization a budget
        self.reserved -= worst
        self.org.reserved -= worst
        self.in_flight -= 1
        spent = _cost(self.prices, usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens) if usage else 0
        tab = current_tab.get()
        if tab is not None and tab.spend is self:
            tab.nanos += spent
        self.answered += spent
        self.org.local += spent
        _wake(self.settled)
        _wake(self.org.settled)

    def record_ended(self, tab, outcome):
        """A record ended here: its calls' cost gives way to what it counts, billed or not (None:
        handed back, to run again).

        Priced here only, and kept on the outcome for its flush (`record_flushed`): the Decimal
        arithmetic of billing.pricing was ~10% of a worker's samples when every record was priced
        twice (issue 55). A batch nothing guards (no cap, no budget) or whose prices are all zero
        counts nothing: no figure here is read for it. Should a cap or a budget come later, the
        database's figure (read each poll) holds every record flushed by then; the bill is the
        flush's tokens at the batch's prices, never these figures.
        """
        counted = 0
        if outcome is not None and self.guarded and self.priced:
            counted = outcome.counted_nanos = tab.weigh(self.counted(outcome))
        self.answered -= tab.nanos
        self.pending += counted
        self.org.local += counted - tab.nanos

    def record_flushed(self, outcome):
        counted = outcome.counted_nanos
        self.pending -= counted
        self.flushed += counted

    @property
    def priced(self):
        prices = self.prices
        return bool(prices.input or prices.cached_input or prices.output)

    def counted(self, outcome):
        """What an outcome counts against the cap and the budget: its billed and unbilled usage."""
        billed, unbilled = outcome.usage, outcome.unbilled
        return _cost(self.prices, billed.prompt_tokens, billed.cached_tokens, billed.completion_tokens) + _cost(
            self.prices, unbilled.prompt_tokens, unbilled.cached_tokens, unbilled.completion_tokens
        )

    def worst_case(self, body):
        prompt_bytes = len(orjson.dumps(body))
        answer = 0
        if self.prices.output:
            limits = [body[key] for key in ANSWER_LIMITS if _count(body.get(key))]
            cap = self.model_cap or settings.OPENRELAY_DEFAULT_MAX_OUTPUT_TOKENS
            answer = min(limits[0], cap) if limits else cap
            answer *= body["n"] if _count(body.get("n")) else 1
        return _cost(self.prices, prompt_bytes, 0, answer)

    def _cap_detail(self, worst):
        return {
            "code": "spend_cap_reached",
            "message": f"Its next call could pass its max_cost of {_usd(self.cap)} USD: spent {_usd(self.spent)} USD "
            f"so far, and the call may cost up to {_usd(worst)} USD. Resume it with a higher max_cost to go on.",
        }

    def _budget_detail(self):
        return {
            "code": "organization_budget_exceeded",
            "message": "Its organization's monthly budget is spent. An administrator can raise it; then resume.",
        }


class GuardedEngine(Protocol):
    """What a Guard needs of its engine (runner.Engine), and all it may reach: how many engines
    share what is left, its loop and database thread (to write a pause), and `held`, which stops
    a paused batch's work there."""

    loop: Any

    @property
    def engines(self) -> int: ...

    async def db(self, fn: Callable[..., Any], *args: Any) -> Any: ...

    def held(self, pk: int) -> None: ...


class Guard:
    """An engine's guardrails: its batches' spends, its organizations' budgets, the breakers."""

    def __init__(self, engine: GuardedEngine) -> None:
        self.engine = engine
        self.spends = {}  # batch pk -> BatchSpend
        self.orgs = {}  # organization id -> OrgSpend
        self.breakers = breaker.Breakers()
        self.writing = set()  # pauses being written (tasks)

    @property
    def engines(self):
        # The live engines (their heartbeats): each may reserve its part of what is left.
        return max(1, self.engine.engines)

    def spend(self, row):
        """The BatchSpend of a batch this engine joins (or already knows)."""
        found = self.spends.get(row["pk"])
        if found is None:
            org = self.orgs.setdefault(row["organization_id"], OrgSpend(row["organization_id"]))
            org.budget = _budget(row)
            found = self.spends[row["pk"]] = BatchSpend(self, row, org)
        return found

    def forget(self, pk):
        self.spends.pop(pk, None)
        self.breakers.forget(pk)

    def polled(self, rows):
        """The poll's rows: each batch's spend as the database has it now, and whether it is paused.
        Returns the pks of the batches paused or resumed since the last poll."""
        changed = []
        for row in rows:
            found = self.spends.get(row["pk"])
            if found is not None:
                was = found.paused
                found.update(row)
                if found.paused != was:
                    changed.append(found.pk)
                _wake(found.settled)
            org = self.orgs.get(row["organization_id"])
            if org is not None:
                org.budget = _budget(row)
        return changed

    def budgets_due(self):
        """The organizations with a budget whose spend was last read OPENRELAY_BUDGET_REFRESH_S ago."""
        now = time.monotonic()
        due = [org for org in self.orgs.values() if org.budget is not None]
        return [org.organization_id for org in due if now - org.read_at >= settings.OPENRELAY_BUDGET_REFRESH_S]

    @staticmethod
    def read_budgets(org_ids):
        """(db thread) What these organizations have spent this month."""
        now = time.monotonic()
        return {org_id: (guardrails.organization_spend_nanos(org_id), now) for org_id in org_ids}

    def budgets_read(self, spent):
        for org_id, (nanos, at) in spent.items():
            org = self.orgs[org_id]
            org.db, org.read_at = nanos, at
            # Since the read covers every flushed record, what counts locally now is what is unflushed.
            org.local = sum(s.pending + s.answered for s in self.spends.values() if s.org is org)
            _wake(org.settled)

    def unread(self, org):
        """What this engine added to the organization's spend since its last read, but for the calls
        of records still running (those stay this engine's until the records end)."""
        return org.local - sum(s.answered for s in self.spends.values() if s.org is org)

    def begin(self, spend, twins=0):
        """A record of `spend`'s batch starts; `twins`: the records waiting for its answer."""
        tab = Tab(spend, 1000 + (twins * reuse.bill_share_permille() if twins else 0))
        current_tab.set(tab)
        return tab

    # ---------------------------------------------------------- pausing

    async def pause(self, spend, reason, detail):
        """Pause the batch (its first pauser's reason stands) and stop its work here."""
        if self.hold(spend):
            await self._write_pause(spend, reason, detail)
        _wake(spend.settled)

    def hold(self, spend):
        """Stop the batch's work here at once (True), unless it is paused already (False)."""
        if spend.paused:
            return False
        spend.paused = spend.pausing = True
        self.engine.held(spend.pk)
        return True

    async def _write_pause(self, spend, reason, detail):
        try:
            await self.engine.db(write_pause, spend.pk, reason, detail)
        finally:
            spend.pausing = False
            _wake(spend.settled)

    async def pause_organization(self, org, detail):
        for spend in [s for s in self.spends.values() if s.org is org]:
            await self.pause(spend, PauseReason.ORGANIZATION_BUDGET, detail)
        _wake(org.settled)

    # ---------------------------------------------------------- the breaker

    async def flushed(self, outcomes):
        """A trip's flushed outcomes ({batch pk: [(record, outcome)]}): move their cost to `flushed`,
        and judge the first-records rule of a batch with failures of its own among them."""
        suspect = []
        for pk, done in outcomes.items():
            spend = self.spends.get(pk)
            if spend is None:
                continue
            for _, outcome in done:
                spend.record_flushed(outcome)
            if self.breakers.suspect(spend, done):
                suspect.append(spend)
        for spend in suspect:
            rules = spend.breaker
            detail, done = await self.engine.db(breaker.judge_window, spend.pk, rules.window, rules.failures)
            self.breakers.judged(spend.pk, done)
            if detail is not None:
                await self.pause(spend, PauseReason.ERROR_BREAKER, detail)

    def record_ended(self, spend, record, tab, outcome):
        """A record ended here (`outcome` None: handed back): settle its cost, and judge the in-a-row
        rule at once, as records end, so a batch failing throughout pauses before its next flush."""
        spend.record_ended(tab, outcome)
        detail = self.breakers.ended(spend, record, outcome)
        if detail is not None and self.hold(spend):
            task = self.engine.loop.create_task(self._write_pause(spend, PauseReason.ERROR_BREAKER, detail))
            self.writing.add(task)
            task.add_done_callback(self.writing.discard)


def write_pause(pk, reason, detail):
    """(db thread) Pause the batch in the database: the first pauser's reason stands."""
    batch = Batch.objects.filter(pk=pk).first()
    if batch is not None and lifecycle.pause(batch, reason, detail=detail):
        logger.info("batch %s paused: %s", batch.public_id, reason)


def _budget(row):
    budget = row["organization__monthly_budget"]
    return guardrails.usd_to_nanos(budget) if budget is not None else None


def _cost(prices, prompt, cached, completion):
    """billing.pricing.cost's total, in integer arithmetic when the prices allow it exactly."""
    rates = _rates(prices)
    if rates is None:
        return cost(prices, prompt_tokens=prompt, cached_tokens=cached, completion_tokens=completion).total_nanos
    cached = min(cached, prompt)  # as billing.pricing.cost: never more cached than prompt tokens
    return (prompt - cached) * rates[0] + cached * rates[1] + completion * rates[2]


@functools.lru_cache(maxsize=256)
def _rates(prices):
    """Nano-dollars a token at each of `prices` (input, cached input, output) when each is a whole
    number, else None. USD per 1M tokens x 1,000 is nanos a token: prices of up to three decimals
    (x the multiplier) make whole numbers, and then a token count times them is exactly what
    billing.pricing's Decimal product rounds to, at a fraction of its cost (issue 55)."""
    rates = []
    for price in (prices.input, prices.cached_input, prices.output):
        rate = Decimal(price) * Decimal(prices.multiplier) * 1000
        if rate != rate.to_integral_value():
            return None
        rates.append(int(rate))
    return tuple(rates)


def _count(value):
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _usd(nanos):
    return format(Decimal(nanos) / NANOS_PER_USD, ".6f")


def _wake(event):
    # Wake every waiter, then arm again for the next change.
    event.set()
    event.clear()
