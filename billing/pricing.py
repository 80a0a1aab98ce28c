"""Prices and cost arithmetic, in Decimal and integers, never float.

The rounding rule (docs/concepts/billing.md):

1. Each part is computed exactly: price x multiplier x tokens / 1,000,000,
   with prices in USD per 1M tokens at the sync rate. Input is charged on
   (prompt - cached) tokens, cached input on cached tokens, output on
   completion tokens (reasoning tokens are part of them).
2. Each part is then rounded once, half-even, to whole nano-dollars
   (1e-9 USD) and kept as an integer. That is what the ledger stores.
3. The total is the sum of the three kept parts, so the parts always add up
   to it, and every amount is shown as its exact kept value, a decimal
   string with 9 places ("0.000007500"). Showing never rounds again.

Integers rather than DecimalField columns because SQLite keeps a DECIMAL
column as a float past 15 significant digits, and sums of floats drift;
integer nanos are exact on SQLite and PostgreSQL alike and sum exactly in
SQL. An int64 holds 9.2 billion USD of nanos.
"""

from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Context, Decimal, Inexact

CURRENCY = "USD"
NANOS_PER_USD = 10**9
TOKENS_PER_PRICE = 10**6  # prices are per 1M tokens
AMOUNT_PLACES = 9

# Wide enough that a 64-bit token count times a 12-digit price times a
# multiplier is never rounded before step 2; Inexact traps prove it.
_EXACT = Context(prec=80, rounding=ROUND_HALF_EVEN, traps=[Inexact])


@dataclass(frozen=True)
class Prices:
    """Sync-rate prices in USD per 1M tokens, and the priority's multiplier."""

    input: Decimal
    cached_input: Decimal
    output: Decimal
    multiplier: Decimal = Decimal(1)

    @classmethod
    def of_batch(cls, batch):
        """The prices a batch snapshotted at create (a later price change never reprices it)."""
        return cls(batch.price_input, batch.price_cached_input, batch.price_output, batch.price_multiplier)


@dataclass(frozen=True)
class Cost:
    """Kept amounts in integer nano-dollars."""

    input_nanos: int = 0
    cached_input_nanos: int = 0
    output_nanos: int = 0

    def __add__(self, other):
        return Cost(
            self.input_nanos + other.input_nanos,
            self.cached_input_nanos + other.cached_input_nanos,
            self.output_nanos + other.output_nanos,
        )

    @property
    def total_nanos(self):
        return self.input_nanos + self.cached_input_nanos + self.output_nanos

    def as_object(self):
        """The API's cost object: decimal strings, exact to the nano-dollar."""
        return {
            "currency": CURRENCY,
            "input": usd(self.input_nanos),
            "cached_input": usd(self.cached_input_nanos),
            "output": usd(self.output_nanos),
            "total": usd(self.total_nanos),
        }


def cost(prices, *, prompt_tokens, cached_tokens, completion_tokens):
    """The cost of this usage at these prices (see the rounding rule above)."""
    # A server reporting more cached tokens than prompt tokens would otherwise
    # have tokens it never received billed at the cached rate.
    cached = min(cached_tokens, prompt_tokens)
    return Cost(
        input_nanos=nanos(prompt_tokens - cached, prices.input, prices.multiplier),
        cached_input_nanos=nanos(cached, prices.cached_input, prices.multiplier),
        output_nanos=nanos(completion_tokens, prices.output, prices.multiplier),
    )


def batch_cost(batch):
    """A batch's cost so far: its live token counters at its snapshotted prices."""
    return cost(
        Prices.of_batch(batch),
        prompt_tokens=batch.input_tokens,
        cached_tokens=batch.cached_tokens,
        completion_tokens=batch.output_tokens,
    )


def unbilled_cost(batch):
    """What a batch's unbilled tokens (answers its records got but are not billed for) come to at
    its snapshotted prices: never charged, but counted against its max_cost and its organization's
    monthly budget (docs/concepts/billing.md)."""
    return cost(
        Prices.of_batch(batch),
        prompt_tokens=batch.unbilled_input_tokens,
        cached_tokens=batch.unbilled_cached_tokens,
        completion_tokens=batch.unbilled_output_tokens,
    )


def spend_nanos(batch):
    """What a batch counts against its max_cost and its organization's budget: billed and unbilled."""
    return batch_cost(batch).total_nanos + unbilled_cost(batch).total_nanos


def nanos(tokens, price_per_mtok, multiplier):
    """tokens at price_per_mtok x multiplier, rounded half-even to whole nano-dollars."""
    exact = _EXACT.multiply(_EXACT.multiply(Decimal(tokens), Decimal(price_per_mtok)), Decimal(multiplier))
    # USD per 1M tokens -> nanos: x 1e9 / 1e6, a shift of the exponent (exact).
    in_nanos = exact.scaleb(3, _EXACT)
    return int(in_nanos.to_integral_value(rounding=ROUND_HALF_EVEN, context=_EXACT))


def usd(amount_nanos):
    """Nano-dollars as a plain decimal string with 9 places, e.g. 7500 -> "0.000007500"."""
    return format(_EXACT.scaleb(Decimal(amount_nanos), -AMOUNT_PLACES), "f")
