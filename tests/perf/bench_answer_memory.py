"""Benchmark: a worker's memory against OPENRELAY_ENGINE_ANSWER_BUDGET_BYTES (not collected by pytest).

    .venv/bin/python -m tests.perf.bench_answer_memory                      # temp SQLite
    .venv/bin/python -m tests.perf.bench_answer_memory --budget-mb 64 --answers 16 --inputs 256 --repeat 3 \\
        --database-url postgres://... --redis-url redis://...

On a throwaway gateway (tests.perf.bench_engine's Stack and Bench: database, simulators, uvicorn), one
qcluster worker started with the budget runs a batch of `--answers` embeddings records whose
simulator answers are `--inputs` x 3,072 floats (256: 16 MB of JSON each), all in flight at once
(the deployment takes 64), `--repeat` times one after the other. It prints, after each batch, the
engine process's RSS and its growth over its RSS before the first one, as x the budget, and the
"peak held" the engine logs (what the budget counted). docs/engine.md holds the numbers (issue 56).
"""

import argparse
import sys
import tempfile
from pathlib import Path

import orjson
import psutil

from tests.perf.bench_engine import MODEL_ZERO, Bench, Scale, Stack
from tests.perf.common import PeakRss

MB = 2**20
DIMENSIONS = 3072


def write_embeddings(path, answers, inputs):
    with open(path, "wb") as out:
        for i in range(answers):
            body = {"model": MODEL_ZERO, "input": [f"{i} {n}" for n in range(inputs)], "dimensions": DIMENSIONS}
            line = {"custom_id": f"emb-{i}", "method": "POST", "url": "/v1/embeddings", "body": body}
            out.write(orjson.dumps(line) + b"\n")


def engine_process(stack, cluster):
    """The qcluster's process that runs an engine (its pid is in the engine's row)."""
    engines = {pid for (pid,) in stack.db.query("SELECT pid FROM batches_engine")}
    tree = [psutil.Process(cluster.pid), *psutil.Process(cluster.pid).children(recursive=True)]
    return next(process for process in tree if process.pid in engines)


def measure(stack, bench, args):
    path = stack.tmp / "embeddings.jsonl"
    write_embeddings(path, args.answers, args.inputs)
    file_id, _ = bench.api.upload(path)
    budget = args.budget_mb * MB
    cluster = stack.start_cluster(1, OPENRELAY_ENGINE_ANSWER_BUDGET_BYTES=budget, OPENRELAY_LOG_LEVEL="INFO")
    bench.warm()
    worker = engine_process(stack, cluster)
    idle = worker.memory_info().rss
    print(
        f"budget {args.budget_mb} MB, {args.answers} answers of {args.inputs} x {DIMENSIONS}; idle {idle / MB:.0f} MB"
    )
    with PeakRss(worker.pid, every_s=0.02) as rss:
        for run in range(args.repeat):
            batch, _, answered = bench.api.create(file_id, endpoint="/v1/embeddings")
            row = bench.wait_done(batch["id"], 1800)
            growth = (rss.peak - idle) / MB
            print(
                f"batch {run + 1}: {row['completed']}/{args.answers} in {row['completed_at'] - answered:.1f} s; "
                f"RSS now {worker.memory_info().rss / MB:.0f} MB, peak growth {growth:.0f} MB = "
                f"{growth * MB / budget:.1f}x the budget",
                flush=True,
            )
    stack.stop_cluster(cluster)
    for log in sorted(stack.logs.glob("qcluster*")):
        for line in log.read_text(errors="replace").splitlines():
            if "answer budget" in line:
                print(f"engine log: {line[-160:]}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-mb", type=int, default=64)
    parser.add_argument("--answers", type=int, default=16)
    parser.add_argument("--inputs", type=int, default=256, help="inputs an answer embeds (256: 16 MB of JSON)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--database-url")
    parser.add_argument("--redis-url")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="openrelay-bench-") as tmp:
        stack = Stack(Path(tmp), args.database_url, args.redis_url, print, "uvicorn")
        try:
            bench = Bench(stack, Scale(), print)
            bench.setup()
            measure(stack, bench, args)
        finally:
            stack.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
