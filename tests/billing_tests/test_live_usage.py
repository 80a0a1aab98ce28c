"""The batch's usage object rises while the batch runs, and ends equal to the ledger."""

import time
from decimal import Decimal

from billing.models import LedgerEntry
from tests.billing_tests.conftest import LONG, as_usd, create, run_batch_in_thread
from tests.helpers import chat


def test_it_shows_usage_and_cost_rising_while_the_batch_runs(alice, model, sim):
    # Records finish one after another, each well after a flush (every 0.25 s).
    batch = create(alice, [chat(f"{LONG} record {i} [[latency:{400 * i}]]") for i in range(6)])
    worker = run_batch_in_thread(batch)
    seen = []
    deadline = time.monotonic() + 20
    while worker.is_alive():
        assert time.monotonic() < deadline, "the batch did not finish"
        body = alice.client.get(f"/v1/batches/{batch.public_id}").json()
        if body["usage"] is not None:
            assert "cost" not in body["usage"]  # OpenAI's five fields; the cost is openrelay.cost
            seen.append((body["request_counts"]["completed"], {**body["usage"], "cost": body["openrelay"]["cost"]}))
        time.sleep(0.05)
    worker.join()
    final = alice.client.get(f"/v1/batches/{batch.public_id}").json()
    assert final["status"] == "completed"
    seen.append((final["request_counts"]["completed"], {**final["usage"], "cost": final["openrelay"]["cost"]}))

    totals = [Decimal(usage["cost"]["total"]) for _, usage in seen]
    tokens = [usage["input_tokens"] for _, usage in seen]
    assert totals == sorted(totals) and tokens == sorted(tokens)  # never goes down
    # Seen part-way: some records counted and priced, not all of them.
    partial = [usage for completed, usage in seen if 0 < completed < 6]
    assert partial and Decimal(partial[0]["cost"]["total"]) < totals[-1]
    assert len(set(totals)) >= 3
    # Each snapshot is the cost of its own tokens, so the last one is the ledger's.
    assert final["openrelay"]["cost"]["total"] == as_usd(
        LedgerEntry.objects.get(batch_id=batch.public_id).total_cost_nanos
    )
