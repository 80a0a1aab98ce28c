"""Billing fixtures: a priced model on the real simulator, batches created through the API.

Batches here are created with POST /v1/batches (not tests/helpers'
make_batch) so every test runs on the prices create snapshots.
"""

import threading
from datetime import UTC, datetime
from decimal import Decimal
from fractions import Fraction

import pytest
from django.db import connection

from batches.engine.runner import run_batch
from batches.models import Batch
from billing.models import LedgerEntry
from openrelay.core.models import Price
from tests.helpers import CHAT, MODEL, deploy

# USD per 1M tokens at the sync rate.
PRICE_INPUT, PRICE_CACHED_INPUT, PRICE_OUTPUT = Decimal("0.20"), Decimal("0.05"), Decimal("0.80")
# ~200 prompt tokens: the simulator reports 64 of them cached.
LONG = "word " * 160


@pytest.fixture(autouse=True)
def _storage_and_loopback(tmp_storage, settings):
    settings.OPENRELAY_ALLOW_PRIVATE_URLS = True  # executors and callbacks (tests/fixtures/) listen on 127.0.0.1


@pytest.fixture
def model(transactional_db, sim):
    """Overrides the shared `model`: priced, and on the session's simulator (not a simulator of the test's own)."""
    model = deploy(MODEL, sim.base_url)
    Price.objects.create(
        model=model, input_per_mtok=PRICE_INPUT, cached_input_per_mtok=PRICE_CACHED_INPUT, output_per_mtok=PRICE_OUTPUT
    )
    return model


def record(custom_id, body):
    return {"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body}


def create(persona, bodies, **params):
    """Create a batch through the API from inline bodies (custom_ids req-1, req-2, ...)."""
    requests = [record(f"req-{i}", body) for i, body in enumerate(bodies, start=1)]
    response = persona.client.post(
        "/v1/batches", {"endpoint": CHAT, "completion_window": "24h", "requests": requests, **params}, format="json"
    )
    assert response.status_code == 200, response.content
    assert response.json()["errors"] is None
    return Batch.objects.get(public_id=response.json()["id"])


def run_batch_in_thread(batch):
    """run_batch on a worker thread, as a q2 worker would; the thread closes its connection
    (an open one would keep the test database from being dropped)."""

    def work():
        try:
            run_batch(batch.pk)
        finally:
            connection.close()

    worker = threading.Thread(target=work)
    worker.start()
    return worker


def usage_of_lines(lines):
    """(prompt, cached, completion) summed over result lines that carry a usage."""
    usages = [
        line["response"]["body"]["usage"]
        for line in lines
        if line["response"] and isinstance(line["response"]["body"], dict) and "usage" in line["response"]["body"]
    ]
    return (
        sum(u["prompt_tokens"] for u in usages),
        sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages),
        sum(u["completion_tokens"] for u in usages),
    )


def oracle_nanos(tokens, price, multiplier):
    """Independent of billing.pricing: exact rationals, then Python's half-even round()."""
    return round(Fraction(tokens) * Fraction(price) * Fraction(multiplier) * 1000)


def oracle_cost(
    prompt, cached, completion, multiplier=Decimal("0.5"), prices=(PRICE_INPUT, PRICE_CACHED_INPUT, PRICE_OUTPUT)
):
    """(input, cached_input, output, total) nanos for this usage."""
    parts = (
        oracle_nanos(prompt - cached, prices[0], multiplier),
        oracle_nanos(cached, prices[1], multiplier),
        oracle_nanos(completion, prices[2], multiplier),
    )
    return (*parts, sum(parts))


def as_usd(amount_nanos):
    return f"{amount_nanos // 10**9}.{amount_nanos % 10**9:09d}"


# ---------------------------------------------------------------------------
# Shared by the test modules (test_what_is_billed.py and test_every_call_counts.py; test_usage_endpoint.py and test_admin.py)

WEATHER_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}


def first_message(body):
    return body["messages"][0]["content"]


def assert_billed(batch, prompt, cached, completion):
    """The ledger entry, and the batch's usage object, bill exactly this usage."""
    entry = LedgerEntry.objects.get(batch_id=batch.public_id)
    assert (entry.input_tokens, entry.cached_tokens, entry.output_tokens) == (prompt, cached, completion)
    expected = oracle_cost(prompt, cached, completion)
    assert (
        entry.input_cost_nanos,
        entry.cached_input_cost_nanos,
        entry.output_cost_nanos,
        entry.total_cost_nanos,
    ) == expected
    return entry


OTHER_MODEL = "openrelay/other-model"


def entry(org, day, model=MODEL, tokens=(1000, 256, 300), batch_id=None, hour=12):
    """A ledger entry billed at noon (UTC) of `day`, priced like the engine would (standard rate)."""
    prompt, cached, completion = tokens
    parts = oracle_cost(prompt, cached, completion)
    return LedgerEntry.objects.create(
        organization=org,
        batch_id=batch_id or f"batch_{org.pk}_{day}_{model}_{hour}",
        batch_status="completed",
        model_name=model,
        priority="standard",
        input_tokens=prompt,
        cached_tokens=cached,
        output_tokens=completion,
        input_cost_nanos=parts[0],
        cached_input_cost_nanos=parts[1],
        output_cost_nanos=parts[2],
        total_cost_nanos=parts[3],
        created_at=datetime.combine(day, datetime.min.time(), tzinfo=UTC).replace(hour=hour),
    )
