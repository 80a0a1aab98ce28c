"""Checkpoint costs (issue 19), in throwaway state (not collected by pytest):

    .venv/bin/python tests/perf/bench_checkpoints.py                       # SQLite in a temp dir
    .venv/bin/python tests/perf/bench_checkpoints.py --database-url postgres://postgres@127.0.0.1:5432/postgres

1. per checkpointed turn: the state's bytes, encode µs, and the write's µs alone and
   group-committed (64 records' checkpoints in one statement, as a busy engine writes them);
2. a tool batch (50,000 records, one round each, fast executor) through an in-process engine:
   checkpoints written and their bytes, the peak bytes held in Record.checkpoint while it ran
   (sampled every 0.2 s), and what is left once it is done (nothing);
3. resume after kill -9: a real cluster working 6-round tool records against a slow executor is
   killed; a new one starts at once: the seconds until the first resumed round reaches the
   executor (the default 10 s lease is most of it) and until the batch completes.
"""

import argparse
import asyncio
import os
import statistics
import sys
import threading
import time
from pathlib import Path

from tests.perf.common import django_in_throwaway_database

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def setup(database_url):
    os.environ["OPENRELAY_ALLOW_PRIVATE_URLS"] = "true"
    return django_in_throwaway_database(database_url, "ckbench")


def make_world(sim):
    from openrelay.core.models import Deployment, Model
    from tests.helpers import make_persona

    model = Model.objects.create(name="openrelay/gemma-4-31b")
    Deployment.objects.create(model=model, base_url=sim.base_url, upstream_model="sim", max_concurrency=64)
    return make_persona("bench").org


TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def tool_lines(executor, n, rounds):
    from tests.helpers import chat

    return [
        chat(f"q{i} [[tool_rounds:{rounds}]]", tools=[TOOL], openrelay={"tool_config": {"url": executor.url}})
        for i in range(n)
    ]


def bench_turn(org, executor):
    """The state after each of 6 rounds of the simulator's loop, encoded and written."""
    from batches.engine import checkpoints, store
    from tests.helpers import make_batch

    batch = make_batch(org, tool_lines(executor, 640, 6))
    claimed = store.claim(batch.pk, "bench", 640, lease_s=600)
    added, rows = [], []
    for r in range(6):
        call = {"id": f"call_{r}_0", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
        added += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": f"get_weather result for call_{r}_0"},
        ]
        state = {"kind": "tools", "rounds": r + 1, "usage": [40 * r, 0, 12 * r, 0], "added": added, "pending": None}
        started = time.perf_counter()
        for _ in range(1000):
            data = checkpoints.encode(state)
        encode_us = (time.perf_counter() - started) * 1000
        alone = []
        for record in claimed[:64]:
            started = time.perf_counter()
            store.save_checkpoints("bench", {record.pk: data})
            alone.append((time.perf_counter() - started) * 1e6)
        group = claimed[64:]
        started = time.perf_counter()
        for i in range(0, len(group), 64):
            store.save_checkpoints("bench", {record.pk: data for record in group[i : i + 64]})
        grouped = (time.perf_counter() - started) * 1e6 / len(group)
        rows.append((r + 1, len(data), encode_us, statistics.median(alone), grouped))
    print("round  bytes  encode_us  write_alone_us  write_grouped_us")
    for row in rows:
        print("{:5d}  {:5d}  {:9.1f}  {:14.0f}  {:16.0f}".format(*row))


def bench_batch(org, executor, records):
    from django.db import connection

    from batches.engine.runner import Engine
    from batches.models import Record
    from tests.helpers import make_batch

    batch = make_batch(org, tool_lines(executor, records, 1))
    engine = Engine(only=[batch.pk], until_closed=True)
    peak = {"bytes": 0, "records": 0}
    stop = threading.Event()

    def sample():
        from django.db import connections

        while not stop.wait(0.2):
            with connections["default"].cursor() as cursor:
                cursor.execute(
                    "SELECT COUNT(checkpoint), COALESCE(SUM(LENGTH(checkpoint)), 0) FROM batches_record "
                    "WHERE batch_id = %s AND checkpoint IS NOT NULL",
                    [batch.pk],
                )
                count, total = cursor.fetchone()
            if total > peak["bytes"]:
                peak.update(bytes=total, records=count)
        connections.close_all()

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.monotonic()
    asyncio.run(engine.run())
    took = time.monotonic() - started
    stop.set()
    sampler.join()
    writer = engine.checkpoints
    left = Record.objects.filter(batch=batch, checkpoint__isnull=False).count()
    done = Record.objects.filter(batch=batch, status="succeeded").count()
    print(
        f"{records} tool records ({done} succeeded) in {took:.1f} s on {connection.vendor}: "
        f"{writer.written} checkpoints, {writer.bytes / max(1, writer.written):.0f} bytes each, "
        f"{writer.bytes / records:.0f} bytes written per record; peak held {peak['bytes']} bytes in "
        f"{peak['records']} records ({peak['bytes'] / max(1, peak['records']):.0f} per record in flight); "
        f"left after the batch: {left} checkpoints"
    )


def bench_resume(org, executor):
    from tests.fixtures.tool_executor import sleep
    from tests.helpers import make_batch, status_of
    from tests.processes import cluster

    executor.reset()
    executor.answer(sleep(0.2))
    batch = make_batch(org, tool_lines(executor, 20, 6))
    data_dir = os.environ["OPENRELAY_DATA_DIR"]  # the clusters read the same files
    first = cluster(data_dir)
    deadline = time.monotonic() + 60
    while len(executor.received) < 40:
        assert time.monotonic() < deadline, "no progress"
        time.sleep(0.02)
    first.kill()
    killed_at, seen = time.monotonic(), len(executor.received)
    second = cluster(data_dir)
    try:
        while len(executor.received) <= seen:
            assert time.monotonic() < killed_at + 60, "no resume"
            time.sleep(0.005)
        resumed = time.monotonic() - killed_at
        while status_of(batch) != "completed":
            assert time.monotonic() < killed_at + 120, "no completion"
            time.sleep(0.05)
        completed = time.monotonic() - killed_at
    finally:
        second.stop()
        first.stop()
    rounds = len(executor.received)
    print(
        f"kill -9 after {seen} rounds of 120: first resumed round {resumed:.2f} s after the kill "
        f"(lease {os.environ.get('OPENRELAY_LEASE_S', '10')} s), batch completed {completed:.2f} s after; "
        f"{rounds - 120} rounds sent twice"
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--database-url")
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--skip", default="", help="comma-separated: turn,batch,resume")
    args = parser.parse_args()
    dropper = setup(args.database_url)
    from openrelay.simulator.config import SimulatorConfig
    from openrelay.simulator.server import run_in_thread
    from tests.fixtures.tool_executor import ExecutorServer

    skip = set(filter(None, args.skip.split(",")))
    executor = ExecutorServer().start()
    try:
        with run_in_thread(SimulatorConfig()) as sim:
            org = make_world(sim)
            if "turn" not in skip:
                bench_turn(org, executor)
            if "batch" not in skip:
                bench_batch(org, executor, args.records)
            if "resume" not in skip:
                bench_resume(org, executor)
    finally:
        executor.stop()
        if dropper:
            dropper()


if __name__ == "__main__":
    main()
