"""Guardrails (issue 37), in throwaway state (not collected by pytest):

    .venv/bin/python tests/perf/bench_guardrails.py                       # SQLite in a temp dir
    .venv/bin/python tests/perf/bench_guardrails.py --database-url postgres://postgres@127.0.0.1:5432/postgres

1. spend cap: a batch of long answers (max_tokens 4,000, each drawing 2,000) on a deployment of
   64 calls in flight, capped at $2 (output $10 / 1M tokens): the spend when it pauses against
   the cap and the bound (64 calls' worst case), with one engine and with two; then resumed
   without a cap: every record billed exactly once (calls == records, tokens == the lines' sum);
2. breaker: 50,000 records the model refuses with a 400: the records that ran before the
   breaker paused the batch (default rules: 20 of the first 100, or 50 in a row);
3. pause -> the last new model call, and resume -> the first one, in ms (64 calls in flight,
   100 ms each).
"""

import argparse
import asyncio
import os
import sys
import threading
import time
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.perf.common import django_in_throwaway_database  # noqa: E402

NANOS = 10**9


class Engines:
    """In-process engines (as worker processes run them), each in a thread, until stopped."""

    def __init__(self, count):
        from batches.engine.runner import Engine

        self.engines = [Engine() for _ in range(count)]
        self.threads = [threading.Thread(target=self._run, args=(e,)) for e in self.engines]

    @staticmethod
    def _run(engine):
        from django.db import connections

        try:
            asyncio.run(engine.run())
        finally:
            connections.close_all()

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        for engine in self.engines:
            engine.request_stop()
        for thread in self.threads:
            thread.join(timeout=60)


def wait(predicate, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.01)


def fresh(batch):
    batch.refresh_from_db()
    return batch


def priced(org, bodies, **fields):
    from batches.models import Batch
    from tests.helpers import make_batch

    batch = make_batch(org, bodies)
    Batch.objects.filter(pk=batch.pk).update(price_output=Decimal("10"), price_multiplier=1, **fields)
    return fresh(batch)


def running(batch):
    from batches.models import Record

    return Record.objects.filter(batch=batch, status="running").count()


def spend_cap(org, sim, engines):
    from batches import guardrails
    from billing.pricing import batch_cost
    from tests.helpers import assert_exactly_once, chat

    cap = 2 * NANOS
    worst = 4000 * 10 * 1000  # 4,000 tokens at $10 / 1M, in nanos
    start_calls = sim.request_count
    batch = priced(org, [chat(f"[[tokens:2000]] q{i}", max_tokens=4000) for i in range(400)], max_cost_nanos=cap)
    with Engines(engines):
        wait(lambda: fresh(batch).paused_at is not None, 120, "the cap to pause the batch")
        wait(lambda: running(batch) == 0, 60, "calls in flight to settle")
        time.sleep(0.5)  # the last flush
        spent = batch_cost(fresh(batch)).total_nanos
        ran = fresh(batch).completed_count
        guardrails.resume_batch(fresh(batch), max_cost_nanos=1000 * NANOS)
        wait(lambda: fresh(batch).status == "completed", 300, "the resumed batch to complete")
    assert_exactly_once(batch, 400)
    calls = sim.request_count - start_calls
    return {
        "engines": engines,
        "cap_usd": cap / NANOS,
        "spent_at_pause_usd": spent / NANOS,
        "overshoot_usd": max(0, spent - cap) / NANOS,
        "bound_usd (64 x worst case)": 64 * worst / NANOS,
        "records_run_at_pause": ran,
        "calls_total": calls,
        "records": 400,
        "billed_once": calls == 400,
    }


def breaker(org, records):
    from batches import guardrails
    from tests.helpers import chat

    rules = guardrails.Breaker.default()
    batch = priced(org, [chat(f"[[status:400]] q{i}") for i in range(records)], **rules.as_fields())
    started = time.monotonic()
    with Engines(1):
        wait(lambda: fresh(batch).paused_at is not None, 120, "the breaker to pause the batch")
        took = time.monotonic() - started
        wait(lambda: running(batch) == 0, 60, "calls in flight to settle")
        time.sleep(0.5)
    batch = fresh(batch)
    return {
        "records": records,
        "finished_at_pause": batch.completed_count + batch.failed_count,
        "seconds_to_pause": round(took, 2),
        "code": batch.pause_detail["code"],
    }


def pause_latency(org, sim):
    from batches import guardrails
    from tests.helpers import chat

    batch = priced(org, [chat(f"[[latency:100]] q{i}") for i in range(5000)])
    with Engines(1):
        wait(lambda: fresh(batch).completed_count >= 300, 60, "the batch to run")
        guardrails.pause_batch(fresh(batch))
        paused_at, last_change, count = time.monotonic(), time.monotonic(), sim.request_count
        while time.monotonic() - paused_at < 2.0:
            if sim.request_count != count:
                count, last_change = sim.request_count, time.monotonic()
            time.sleep(0.002)
        guardrails.resume_batch(fresh(batch))
        resumed_at = time.monotonic()
        wait(lambda: sim.request_count > count, 10, "a call after resume")
        first_after = time.monotonic() - resumed_at
    return {
        "last_call_after_pause_ms": round((last_change - paused_at) * 1000, 1),
        "first_call_after_resume_ms": round(first_after * 1000, 1),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--breaker-records", type=int, default=50_000)
    args = parser.parse_args()
    os.environ["OPENRELAY_ALLOW_PRIVATE_URLS"] = "true"
    os.environ["OPENRELAY_ADAPTIVE_CONCURRENCY"] = "false"  # 64 calls in flight from the start
    dropper = django_in_throwaway_database(args.database_url, "grbench")
    from openrelay.core.models import Deployment, Model
    from openrelay.simulator.config import SimulatorConfig
    from openrelay.simulator.server import run_in_thread
    from tests.helpers import make_persona

    try:
        with run_in_thread(SimulatorConfig(latency_ms=50)) as sim:
            model = Model.objects.create(name="openrelay/gemma-4-31b")
            Deployment.objects.create(model=model, base_url=sim.base_url, upstream_model="sim", max_concurrency=64)
            org = make_persona("bench").org
            for engines in (1, 2):
                print("spend cap", spend_cap(org, sim, engines), flush=True)
            print("breaker", breaker(org, args.breaker_records), flush=True)
            print("pause", pause_latency(org, sim), flush=True)
    finally:
        if dropper:
            dropper()


if __name__ == "__main__":
    main()
