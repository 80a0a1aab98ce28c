"""An engine in a thread of the test process, and batches with prices and guardrails."""

from decimal import Decimal

from batches.models import Batch, Record
from tests.helpers import chat, make_batch

# $10 per 1M output tokens at the full rate, input free: a 100-token answer costs 1,000,000 nanos.
OUTPUT_PRICE = Decimal("10")


def priced_batch(org, count, *, text="q", max_cost_nanos=None, breaker=(0, 0, 0), **body):
    """`count` chat records of `text` (with `body`), output priced at OUTPUT_PRICE, full rate."""
    batch = make_batch(org, [chat(f"{text} {i}", **body) for i in range(count)])
    window, failures, consecutive = breaker
    Batch.objects.filter(pk=batch.pk).update(
        price_output=OUTPUT_PRICE,
        price_multiplier=1,
        max_cost_nanos=max_cost_nanos,
        breaker_window=window,
        breaker_failures=failures,
        breaker_consecutive=consecutive,
    )
    batch.refresh_from_db()
    return batch


def fresh(batch):
    batch.refresh_from_db()
    return batch


def running(batch):
    return Record.objects.filter(batch=batch, status="running").count()


def finished(batch):
    return Record.objects.filter(batch=batch, status__in=("succeeded", "failed")).count()
