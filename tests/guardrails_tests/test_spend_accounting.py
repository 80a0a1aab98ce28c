"""Issue 55, item 4: the guardrails price a record once, and a record of a batch nothing guards not at all.

BatchSpend priced every record twice (as it ended and as it was flushed) through billing.pricing's
Decimal arithmetic, ~10% of a worker's samples, even for a batch with no cap, no budget and zero
prices. The figures a cap reads must stay exact: what a record counts as it ends is what its flush
moves.
"""

from decimal import Decimal
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from batches.engine import spend
from batches.engine.calls.usage import Usage
from batches.engine.outcomes import RecordOutcome
from billing.pricing import Prices, cost

# Prices of more than three decimals: priced by billing.pricing's Decimal arithmetic (spend._rates).
PRICES = (Decimal("2.5"), Decimal("1.25"), Decimal("0.0375"))


def _row(cap=None, prices=PRICES, budget=None):
    return {
        "pk": 1,
        "organization_id": 7,
        "max_cost_nanos": cap,
        "input_tokens": 0,
        "cached_tokens": 0,
        "output_tokens": 0,
        "unbilled_input_tokens": 0,
        "unbilled_cached_tokens": 0,
        "unbilled_output_tokens": 0,
        "price_input": prices[0],
        "price_cached_input": prices[1],
        "price_output": prices[2],
        "price_multiplier": Decimal(1),
        "breaker_window": 0,
        "breaker_failures": 0,
        "breaker_consecutive": 0,
        "paused_at": None,
        "model__max_output_tokens": None,
        "organization__monthly_budget": budget,
    }


def _outcome():
    return RecordOutcome(
        True,
        200,
        usage=Usage(prompt_tokens=1_234, completion_tokens=567, cached_tokens=200),
        unbilled=Usage(prompt_tokens=10, completion_tokens=3),
    )


@pytest.fixture
def priced(monkeypatch):
    """How many times billing.pricing.cost ran (it still runs: the count is all that is watched)."""
    calls = []

    def counting(*args, **kwargs):
        calls.append(1)
        return cost(*args, **kwargs)

    monkeypatch.setattr(spend, "cost", counting)
    return calls


def _guard():
    return spend.Guard(SimpleNamespace(engines=1, loop=None))


def _end_and_flush(batch, outcomes):
    for outcome in outcomes:
        batch.record_ended(spend.Tab(batch), outcome)
    for outcome in outcomes:
        batch.record_flushed(outcome)


def test_a_capped_batch_prices_each_record_once_and_its_flush_moves_that_exact_figure(priced):
    batch = _guard().spend(_row(cap=10**12))
    priced.clear()  # the database's figure, priced as the batch is joined (and at each poll)
    outcomes = [_outcome() for _ in range(5)]
    for outcome in outcomes:
        batch.record_ended(spend.Tab(batch), outcome)
    prices = Prices(*PRICES)
    billed = cost(prices, prompt_tokens=1_234, cached_tokens=200, completion_tokens=567).total_nanos
    unbilled = cost(prices, prompt_tokens=10, cached_tokens=0, completion_tokens=3).total_nanos
    assert batch.pending == 5 * (billed + unbilled) and batch.spent == batch.pending
    calls = len(priced)
    for outcome in outcomes:
        batch.record_flushed(outcome)
    assert len(priced) == calls == 5 * 2  # billed and unbilled, once a record
    assert (batch.pending, batch.flushed) == (0, 5 * (billed + unbilled))


def test_an_organization_budget_guards_a_batch_without_a_cap(priced):
    batch = _guard().spend(_row(budget=Decimal("100")))
    _end_and_flush(batch, [_outcome()])
    assert batch.flushed > 0 and batch.org.local == batch.flushed


@pytest.mark.parametrize(
    "row",
    [_row(), _row(cap=10**12, prices=(Decimal(0), Decimal(0), Decimal(0)))],
    ids=["no cap nor budget", "zero prices"],
)
def test_a_batch_whose_figures_nothing_reads_prices_nothing(priced, row):
    batch = _guard().spend(row)
    priced.clear()  # the database's figure, priced as the batch is joined (and at each poll)
    _end_and_flush(batch, [_outcome() for _ in range(5)])
    assert priced == []
    assert (batch.pending, batch.flushed, batch.org.local) == (0, 0, 0)


def test_a_cap_set_while_records_wait_for_their_flush_leaves_no_figure_negative(priced):
    """Ended unguarded, flushed after a cap came (a resume with max_cost): the flush moves what
    was counted, nothing; the database's figure holds the record from the next poll on."""
    guard = _guard()
    batch = guard.spend(_row())
    outcome = _outcome()
    batch.record_ended(spend.Tab(batch), outcome)
    guard.polled([_row(cap=10**12)])
    batch.record_flushed(outcome)
    assert (batch.pending, batch.flushed) == (0, 0)


@given(
    prices=st.tuples(*[st.decimals(min_value=0, max_value=100, places=6, allow_nan=False)] * 3),
    multiplier=st.sampled_from([Decimal(1), Decimal("0.5"), Decimal(2), Decimal("1.5")]),
    tokens=st.tuples(*[st.integers(min_value=0, max_value=10**9)] * 3),
)
def test_the_figures_are_billing_s_to_the_nano_whatever_the_prices(prices, multiplier, tokens):
    """Whole nanos a token go by integer arithmetic, the rest by billing.pricing: either way its figure."""
    at = Prices(*prices, multiplier)
    prompt, cached, completion = tokens
    expected = cost(at, prompt_tokens=prompt, cached_tokens=cached, completion_tokens=completion).total_nanos
    assert spend._cost(at, prompt, cached, completion) == expected
