"""How fast a model works now and what is queued on it: the engine's figures a quote's time needs.

Read through these few functions only, from what the engines already write
(the running batches' progress samples and counters, finished batches'
timestamps, the adaptive limits they publish), so the engine's internals
can change under them.

Work is counted in units a record costs the server: its output tokens
plus INPUT_WEIGHT of its input tokens (a prompt token is prefilled in one
pass with the others; an output token is decoded alone). Measured rates are
turned into units a second, so a batch of longer answers than those running
is quoted slower.
"""

from dataclasses import dataclass, field
from datetime import timedelta

from batches import catalog, progress, windows
from batches.models import Batch, BatchStatus

INPUT_WEIGHT = 0.05
RECENT_BATCHES = 5  # finished batches whose pace stands in when none runs
RECENT_WINDOW = timedelta(days=1)
# The quote's run of the shares stops at least this often while a deadline's need moves (a step), and
# never runs more steps than this (a sum over every running batch, each step).
DEADLINE_STEPS_A_WINDOW = 8
MAX_STEPS = 2000


def units(input_tokens, output_tokens):
    return output_tokens + INPUT_WEIGHT * input_tokens


@dataclass
class Queued:
    """A running batch's work left, as fair sharing hands out the model's pace."""

    organization_id: int
    expedited: bool
    units: float
    aim_s: float | None = None  # seconds from now its deadline rule aims to finish by (windows.seconds_to_aim)


@dataclass
class Pace:
    units_per_s: float | None  # the model's measured pace; None: nothing to measure
    records_per_s: float | None
    basis: str  # "running" (the last minute's running batches), "recent_batches", "none"
    queued: list = field(default_factory=list)  # [Queued] of every running batch on the model
    queued_records: int = 0
    concurrency_limit: int = 0


def model_pace(model_id, now, fallback_units_per_record):
    """The model's pace and its queue now. `fallback_units_per_record` prices a running batch that
    has finished no record yet (the quoted batch's own)."""
    running = list(
        Batch.objects.filter(model_id=model_id, status=BatchStatus.IN_PROGRESS).values(
            "organization_id",
            "priority",
            "total_count",
            "completed_count",
            "failed_count",
            "input_tokens",
            "output_tokens",
            "progress",
            "in_progress_at",
            "created_at",
            "expires_at",
        )
    )
    pace = Pace(None, None, "none", concurrency_limit=catalog.concurrency_now().get(model_id, 0))
    records_per_s = units_per_s = 0.0
    for row in running:
        done = row["completed_count"] + row["failed_count"]
        per_record = units(row["input_tokens"], row["output_tokens"]) / done if done else fallback_units_per_record
        left = max(0, row["total_count"] - done)
        pace.queued.append(
            Queued(row["organization_id"], row["priority"] == "expedited", left * per_record, _aim_s(row, now))
        )
        pace.queued_records += left
        rate = _running_rate(row, now)
        records_per_s += rate
        units_per_s += rate * per_record
    if units_per_s > 0:
        pace.units_per_s, pace.records_per_s, pace.basis = units_per_s, records_per_s, "running"
        return pace
    recent = _recent_pace(model_id, now)
    if recent is not None:
        pace.units_per_s, pace.records_per_s = recent
        pace.basis = "recent_batches"
    return pace


def _aim_s(row, now):
    if row["expires_at"] is None:
        return None
    window_s = (row["expires_at"] - row["created_at"]).total_seconds()
    return windows.seconds_to_aim((row["expires_at"] - now).total_seconds(), window_s)


def _running_rate(row, now):
    # The dashboard's rate: records finished a second over the last minute (batches.progress).
    start = row["in_progress_at"].timestamp() if row["in_progress_at"] else None
    samples = progress.series(start, row["progress"])
    return progress.rate(samples, now.timestamp(), row["completed_count"] + row["failed_count"]) or 0.0


def _recent_pace(model_id, now):
    """(units/s, records/s) the model's last finished batches ran at, from their start and finish."""
    finished = (
        Batch.objects.filter(
            model_id=model_id,
            status=BatchStatus.COMPLETED,
            in_progress_at__isnull=False,
            finalizing_at__gte=now - RECENT_WINDOW,
        )
        .order_by("-finalizing_at")
        .values("in_progress_at", "finalizing_at", "completed_count", "failed_count", "input_tokens", "output_tokens")[
            :RECENT_BATCHES
        ]
    )
    records = work = 0.0
    spans = []
    for row in finished:
        spans.append((row["in_progress_at"].timestamp(), row["finalizing_at"].timestamp()))
        records += row["completed_count"] + row["failed_count"]
        work += units(row["input_tokens"], row["output_tokens"])
    # Batches that ran at once shared the model: their work took the union of their spans, not the sum.
    seconds = max(0.001, _covered(spans))
    if not work:
        return None
    return work / seconds, records / seconds


def _covered(spans):
    """Seconds covered by the union of (start, end) spans."""
    covered, reach = 0.0, None
    for start, end in sorted(spans):
        if reach is None or start > reach:
            covered += end - start
            reach = end
        elif end > reach:
            covered += end - reach
            reach = end
    return covered


def finish_after(pace, organization_id, expedited, work, window_s=None):
    """Seconds until `work` units of a new batch with a `window_s` window are done, the model's pace
    shared as the engine's gate shares it (batches.engine.fairness).

    Deadlines first: a batch that would not finish by its deadline rule's aim at its fair share
    (windows.seconds_to_aim) gets the rate that does, ahead of the others, the batches so behind
    together at most DEADLINE_MAX_SHARE of the model while others wait. The rest is shared fairly:
    the organizations with work split it evenly; inside one, expedited batches go before standard
    ones and batches of a kind split its share evenly. Each step runs until the next batch finishes
    (or, while a deadline's need moves, a part of its time left), then shares again. Before the
    quote followed the deadline rule, a 60 s batch beside two 24 h backlogs was quoted at its even
    third (56 s, at risk) where the engine ran it in half its window.
    """
    if not pace.units_per_s:
        return None
    mine = Queued(organization_id, expedited, work, windows.seconds_to_aim(window_s, window_s) if window_s else None)
    batches = [Queued(q.organization_id, q.expedited, q.units, q.aim_s) for q in pace.queued if q.units > 0] + [mine]
    elapsed = 0.0
    for _ in range(MAX_STEPS):
        if mine.units <= 1e-9:
            return elapsed
        rates, moving = _rates(batches, pace.units_per_s, elapsed)
        step = min(min(b.units / rates[id(b)] for b in batches if rates.get(id(b))), moving)
        for batch in batches:
            batch.units -= rates.get(id(batch), 0.0) * step
        elapsed += step
        batches = [b for b in batches if b.units > 1e-9]
    return elapsed + mine.units / (_rates(batches, pace.units_per_s, elapsed)[0].get(id(mine)) or pace.units_per_s)


def _rates(batches, units_per_s, elapsed):
    """Each batch's units a second now, and how long these rates may stand while a deadline's need moves."""
    fair = _shares(batches, units_per_s)
    needs, moving = {}, float("inf")
    for batch in batches:
        if batch.aim_s is None:
            continue
        to_aim = batch.aim_s - elapsed
        need = batch.units / to_aim if to_aim > 1.0 else units_per_s  # past its aim: all it can get
        if need > fair.get(id(batch), 0.0):
            needs[id(batch)] = need
        if to_aim > 1.0:
            moving = min(moving, max(to_aim / DEADLINE_STEPS_A_WINDOW, 0.5))
    if not needs:
        return fair, moving
    others = [b for b in batches if id(b) not in needs]
    total = sum(needs.values())
    room = units_per_s * (windows.DEADLINE_MAX_SHARE if others else 1.0)
    scale = min(1.0, room / total) if others else room / total
    rates = {key: need * scale for key, need in needs.items()}
    rates.update(_shares(others, units_per_s - sum(rates.values())))
    return rates, moving


def fits(durations, window_s):
    """{low, expected, high: seconds or None} against a window: True when even the high figure
    finishes in it, False when the expected one doesn't, else "at_risk"; None when the time can't be told."""
    if durations["expected"] is None:
        return None
    if durations["expected"] > window_s:
        return False
    return True if durations["high"] <= window_s else "at_risk"


def _shares(batches, units_per_s):
    organizations = {}
    for batch in batches:
        organizations.setdefault(batch.organization_id, []).append(batch)
    rates = {}
    for members in organizations.values():
        share = units_per_s / len(organizations)
        first = [b for b in members if b.expedited] or members
        for batch in first:
            rates[id(batch)] = share / len(first)
    return rates
