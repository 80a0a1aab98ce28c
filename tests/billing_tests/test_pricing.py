"""Cost arithmetic: exact, half-even to whole nano-dollars once, parts adding up to the total."""

from decimal import Decimal
from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from billing.pricing import Cost, Prices, batch_cost, cost, nanos, usd
from tests.billing_tests.conftest import as_usd, oracle_nanos

STANDARD, EXPEDITED = Decimal("0.5"), Decimal("1.0")
PRICES = Prices(Decimal("0.20"), Decimal("0.05"), Decimal("0.80"), STANDARD)

tokens = st.integers(min_value=0, max_value=2**63 - 1)
# DecimalField(max_digits=12, decimal_places=6): what a Price can hold.
prices = st.integers(min_value=0, max_value=10**12 - 1).map(lambda micro: Decimal(micro).scaleb(-6))
multipliers = st.sampled_from([STANDARD, EXPEDITED])


def test_it_bills_standard_at_half_and_expedited_at_the_full_sync_rate():
    million = {"prompt_tokens": 10**6, "cached_tokens": 0, "completion_tokens": 10**6}
    standard = cost(PRICES, **million).as_object()
    expedited = cost(Prices(PRICES.input, PRICES.cached_input, PRICES.output, EXPEDITED), **million).as_object()
    assert standard == {
        "currency": "USD",
        "input": "0.100000000",
        "cached_input": "0.000000000",
        "output": "0.400000000",
        "total": "0.500000000",
    }
    assert expedited == {
        "currency": "USD",
        "input": "0.200000000",
        "cached_input": "0.000000000",
        "output": "0.800000000",
        "total": "1.000000000",
    }


def test_it_charges_cached_tokens_at_the_cached_rate_and_only_the_rest_at_input():
    # 744 uncached x 0.20 x 0.5 = 74.4 micro-USD; 256 cached x 0.05 x 0.5 = 6.4; 300 out x 0.80 x 0.5 = 120.
    result = cost(PRICES, prompt_tokens=1000, cached_tokens=256, completion_tokens=300)
    assert result == Cost(input_nanos=74_400, cached_input_nanos=6_400, output_nanos=120_000)
    assert result.as_object()["total"] == "0.000200800"


def test_it_rounds_each_part_half_even_to_whole_nanos():
    # 0.001 USD per 1M tokens is 1 nano a token; standard makes it half a nano.
    price = Decimal("0.001")
    assert [nanos(n, price, STANDARD) for n in (1, 3, 5, 7, 2)] == [0, 2, 2, 4, 1]
    # The three parts are rounded separately and the total is their sum.
    odd = Prices(price, price, price, STANDARD)
    assert cost(odd, prompt_tokens=4, cached_tokens=1, completion_tokens=1) == Cost(2, 0, 0)


def test_it_keeps_tiny_amounts_exact_to_the_nano_and_drops_what_is_below():
    assert cost(PRICES, prompt_tokens=1, cached_tokens=0, completion_tokens=1) == Cost(100, 0, 400)
    # The smallest price, 0.000001 USD per 1M tokens, is a thousandth of a nano a token.
    smallest = Prices(Decimal("0.000001"), Decimal("0.000001"), Decimal("0.000001"), EXPEDITED)
    assert cost(smallest, prompt_tokens=1000, cached_tokens=499, completion_tokens=1500) == Cost(1, 0, 2)


def test_it_computes_huge_amounts_exactly():
    top = Decimal("999999.999999")  # the largest price a Price row holds
    # (2**63 - 1) x 999999999.999 nanos = 9223372036845552434963145224.193 nanos: no digit lost on the way.
    assert nanos(2**63 - 1, top, EXPEDITED) == 9223372036845552434963145224
    assert usd(nanos(10**12, Decimal("60"), EXPEDITED)) == "60000000.000000000"


def test_it_never_bills_more_cached_tokens_than_prompt_tokens():
    assert cost(PRICES, prompt_tokens=10, cached_tokens=64, completion_tokens=0) == cost(
        PRICES, prompt_tokens=10, cached_tokens=10, completion_tokens=0
    )


def test_it_shows_amounts_as_plain_decimal_strings_with_nine_places():
    assert [usd(n) for n in (0, 1, 7_500, 123_456_789_012)] == [
        "0.000000000",
        "0.000000001",
        "0.000007500",
        "123.456789012",
    ]


def test_it_prices_a_batch_from_its_snapshot_and_counters():
    batch = SimpleNamespace(
        price_input=Decimal("0.20"),
        price_cached_input=Decimal("0.05"),
        price_output=Decimal("0.80"),
        price_multiplier=STANDARD,
        input_tokens=1000,
        cached_tokens=256,
        output_tokens=300,
    )
    assert batch_cost(batch) == Cost(74_400, 6_400, 120_000)


@given(prompt=tokens, cached=tokens, completion=tokens, price=st.tuples(prices, prices, prices), mult=multipliers)
def test_it_matches_exact_rational_arithmetic(prompt, cached, completion, price, mult):
    result = cost(Prices(*price, mult), prompt_tokens=prompt, cached_tokens=cached, completion_tokens=completion)
    billed_cached = min(cached, prompt)
    assert result.input_nanos == oracle_nanos(prompt - billed_cached, price[0], mult)
    assert result.cached_input_nanos == oracle_nanos(billed_cached, price[1], mult)
    assert result.output_nanos == oracle_nanos(completion, price[2], mult)
    shown = result.as_object()
    assert shown["total"] == as_usd(result.input_nanos + result.cached_input_nanos + result.output_nanos)
    assert Decimal(shown["total"]) == Decimal(shown["input"]) + Decimal(shown["cached_input"]) + Decimal(
        shown["output"]
    )
