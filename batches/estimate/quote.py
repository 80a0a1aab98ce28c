"""POST /v1/batches/estimate: a quote for a batch, without creating anything.

The inputs are create's (an input file id or inline requests, endpoint,
priority, window), checked by create's own validation
(batches.services.check_input); the answer is an `openrelay.batch_estimate`
object (quote_object). Every figure says how it was made (`method`,
`basis`) and the quote as a whole how far to trust it (`confidence`).
"""

from dataclasses import dataclass, field
from datetime import timedelta

from django.utils import timezone

from batches import endpoints, services, windows
from batches.estimate import history as histories
from batches.estimate import pace as paces
from batches.estimate import tokens
from batches.estimate.records import RecordTally
from batches.reuse import DEFAULT_MODE
from billing.pricing import Prices, cost, usd
from openrelay.core.models import Deployment, Price

DEFAULT_OUTPUT_TOKENS = histories.DEFAULT_OUTPUT_TOKENS


@dataclass
class Quote:
    endpoint: str
    priority: str
    completion_window: str
    model_name: str | None
    accepted: int
    errors: list
    twins: int = 0  # accepted records answered with another's answer (batches.reuse): not quoted
    input: tokens.InputCount | None = None
    output: dict | None = None
    tool_rounds: dict | None = None
    cost: dict | None = None
    time: dict | None = None
    fits_window: object = None  # True, False, "at_risk", or None when the time can't be told
    windows: list = field(default_factory=list)  # every offered window: its price and whether the batch fits
    confidence: str = "low"
    notes: list = field(default_factory=list)


def estimate(
    *,
    organization,
    endpoint,
    completion_window=None,
    input_file_id=None,
    requests=None,
    priority="standard",
    reuse=DEFAULT_MODE,
    **_,
):
    """Quote what `create_batch` with these arguments would run (ApiError where create would refuse):
    the distinct requests only, when reuse would answer twins with another record's answer."""
    now = timezone.now()
    window = windows.parse(completion_window) if completion_window else windows.default()
    tally = RecordTally(endpoint)
    result, checker, read_records = services.check_input(
        organization=organization,
        endpoint=endpoint,
        input_file_id=input_file_id,
        requests=requests,
        observe=tally.observe,
        reuse_mode=reuse,
    )
    quote = Quote(endpoint, priority, window.name, checker.model_name, result.accepted, result.errors)
    quote.twins = len(checker.leader_of)
    if not result.accepted or checker.model_pk is None:
        quote.notes.append("No record would be accepted: nothing would run.")
        return quote
    history = histories.output_history(organization, checker.model_pk, endpoint)
    tally.load_bodies(read_records)
    quote.input = _input_tokens(tally, checker.model_pk, input_file_id)
    rounds = _tool_rounds(tally, history)
    output = _output_tokens(tally, history, rounds)
    input_total = _with_rounds(quote.input.total, tally, rounds)
    quote.tool_rounds, quote.output = rounds, output
    quote.cost = _cost(checker.model_pk, window.multiplier(priority), input_total, output)
    quote.time, durations, finish = _time(
        organization, checker.model_pk, priority, now, input_total, output, tally, window
    )
    quote.fits_window = paces.fits(durations, window.seconds)
    quote.windows = _windows(checker.model_pk, priority, input_total, output, finish, now)
    quote.confidence, quote.notes = _confidence(quote, history)
    return quote


def _input_tokens(tally, model_pk, file_id):
    deployments = list(Deployment.objects.filter(model_id=model_pk, enabled=True).select_related("model"))
    return tokens.count_input(tally, deployments, file_id=file_id)


def _tool_rounds(tally, history):
    if not tally.tool_records:
        return None
    if history.tool_rounds is not None:
        return {
            "records": tally.tool_records,
            "expected": round(history.tool_rounds, 2),
            "basis": "history",
            "history_records": history.tool_records,
        }
    return {"records": tally.tool_records, "expected": 1.0, "basis": "default", "history_records": 0}


def _with_rounds(input_total, tally, rounds):
    """Input tokens over every call: a tool round sends the conversation again (at least its first prompt)."""
    if rounds is None or not tally.records:
        return input_total
    per_record = input_total / tally.records
    return round(input_total + per_record * tally.tool_records * rounds["expected"])


def _output_tokens(tally, history, rounds):
    """low / expected / high over the records: each record's figure bounded by its own output cap."""
    if not endpoints.get(tally.endpoint).answers_tokens:
        return {"low": 0, "expected": 0, "high": 0, "ceiling": 0, "basis": "none", "history_records": 0}
    if history.records:
        figures, basis = (history.low, history.mean, history.high), "history"
    else:
        figures, basis = (1, DEFAULT_OUTPUT_TOKENS, 4 * DEFAULT_OUTPUT_TOKENS), "default"
    low, expected, high = (sum(_capped(figure, cap) * count for cap, count in tally.caps.items()) for figure in figures)
    ceiling = None if None in tally.caps else sum(cap * count for cap, count in tally.caps.items())
    if ceiling is not None and basis == "default":
        basis = "max_tokens"
    calls = 1 + (rounds["expected"] * tally.tool_records / tally.records if rounds else 0)
    return {
        "low": round(low),
        "expected": round(expected * calls),
        "high": round(high * calls),
        "ceiling": round(ceiling * calls) if ceiling is not None and not rounds else ceiling,
        "basis": basis,
        "history_records": history.records,
    }


def _capped(figure, cap):
    return figure if cap is None else min(figure, cap)


def _cost(model_pk, multiplier, input_total, output):
    price = Price.objects.filter(model_id=model_pk).first()
    prices = Prices(
        price.input_per_mtok if price else 0,
        price.effective_cached_input_per_mtok if price else 0,
        price.output_per_mtok if price else 0,
        multiplier,
    )

    def total(output_tokens):
        return usd(
            cost(prices, prompt_tokens=input_total, cached_tokens=0, completion_tokens=output_tokens).total_nanos
        )

    return {
        "currency": "USD",
        "low": total(output["low"]),
        "expected": total(output["expected"]),
        "high": total(output["high"]),
        # The prices the batch would snapshot at create: USD per 1M tokens, times the window's multiplier
        # (its rate; expedited: the sync price).
        "prices": {
            "input": str(prices.input),
            "cached_input": str(prices.cached_input),
            "output": str(prices.output),
            "multiplier": str(prices.multiplier),
        },
        "priced": price is not None,
    }


def _time(organization, model_pk, priority, now, input_total, output, tally, window):
    work = {name: paces.units(input_total, output[name]) for name in ("low", "expected", "high")}
    pace = paces.model_pace(model_pk, now, work["expected"] / tally.records)

    def finish(window_s):
        """{low, expected, high: seconds} on a window: a shorter one runs ahead of the queue (its deadline)."""
        return {
            name: paces.finish_after(pace, organization.pk, priority == "expedited", units, window_s)
            for name, units in work.items()
        }

    durations = finish(window.seconds)
    expected = durations["expected"]
    time = {
        "expected_duration_s": _seconds(expected),
        "low_duration_s": _seconds(durations["low"]),
        "high_duration_s": _seconds(durations["high"]),
        "expected_completion_at": int((now + timedelta(seconds=expected)).timestamp())
        if expected is not None
        else None,
        "window_ends_at": int((now + window.duration).timestamp()),
        "basis": pace.basis,
        "records_per_second": round(pace.records_per_s, 3) if pace.records_per_s else None,
        "concurrency_limit": pace.concurrency_limit,
        "queued_ahead": {
            "records": pace.queued_records,
            "batches": len(pace.queued),
            "organizations": len({q.organization_id for q in pace.queued}),
        },
    }
    return time, durations, finish


def _windows(model_pk, priority, input_total, output, finish, now):
    """Each offered window as this batch would run on it: its rate, what it would cost, whether it fits."""
    return [
        {
            **window.as_object(),
            "multiplier": str(window.multiplier(priority)),
            "cost": {
                name: figure
                for name, figure in _cost(model_pk, window.multiplier(priority), input_total, output).items()
                if name in ("currency", "low", "expected", "high")
            },
            "fits_window": paces.fits(finish(window.seconds), window.seconds),
            "window_ends_at": int((now + window.duration).timestamp()),
        }
        for window in windows.offered()
    ]


def _seconds(value):
    return None if value is None else round(value, 1)


def _confidence(quote, history):
    notes = []
    if quote.input.note:
        notes.append(quote.input.note)
    if not history.records:
        notes.append(
            f"No history of this organization on {quote.model_name} for {quote.endpoint}: output tokens assume "
            f"{DEFAULT_OUTPUT_TOKENS} a record within each record's max_tokens."
        )
    if quote.time["basis"] == "none":
        notes.append(f"No measured pace on {quote.model_name} yet (nothing ran on it in the last day): no time.")
    if quote.tool_rounds is not None and quote.tool_rounds["basis"] == "default":
        notes.append("No tool-calling history: tool-calling records are assumed to take 1 round.")
    if not quote.cost["priced"]:
        notes.append(f"{quote.model_name} has no price: the batch would cost nothing.")
    exact = quote.input.method != tokens.APPROXIMATION
    measured = quote.time["basis"] != "none"
    if exact and history.records and measured:
        return "high", notes
    if history.records or (exact and measured) or quote.output["ceiling"] is not None and measured:
        return "medium", notes
    return "low", notes


def quote_object(quote):
    return {
        "object": "openrelay.batch_estimate",
        "endpoint": quote.endpoint,
        "model": quote.model_name,
        "completion_window": quote.completion_window,
        "priority": quote.priority,
        # `calls`: the records that would call the model, what the figures below quote; the others are
        # twins of theirs (openrelay.reuse), answered with their answers.
        "request_counts": {
            "total": quote.accepted,
            "rejected": len(quote.errors),
            "calls": quote.accepted - quote.twins,
        },
        "errors": {"object": "list", "data": quote.errors} if quote.errors else None,
        "input_tokens": quote.input.as_object() if quote.input else None,
        "output_tokens": quote.output,
        "tool_rounds": quote.tool_rounds,
        "cost": quote.cost,
        "time": quote.time,
        "fits_window": quote.fits_window,
        "windows": quote.windows,
        "confidence": quote.confidence,
        "notes": quote.notes,
    }
