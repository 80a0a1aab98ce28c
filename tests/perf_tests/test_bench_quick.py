"""`manage.py bench --quick` runs from end to end and prints every measurement (CI's only benchmark run).

The figures of a quick run mean nothing (500 records, tiny files, a shared
machine): this proves the command, its throwaway state and its processes
work, on SQLite, and on PostgreSQL + Redis when the suite runs there.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.perf.bench_engine import OPT_IN, TARGETS

ROOT = Path(__file__).resolve().parents[2]
ROW_NAMES = (
    "create",
    "upload",
    "end to end",
    "first model call",
    "latency-bound",
    "finalize",
    "scale-out",
    "worker peak RSS",
    "fairness",
    "recovery",
    "many batches",
)


# On PostgreSQL + Redis: the bench's own database and broker set-up and SQL, through the
# parts that run a batch through a warm cluster and time it (end to end, first call, many
# batches: the one-statement flush of many batches). The rest runs in the SQLite pass;
# create, finalize and flushes on PostgreSQL have tests of their own. Keeps each pass of
# the suite under 10 minutes.
POSTGRES_PARTS = {"e2e": ("end to end",), "first_call": ("first model call",), "many": ("many batches",)}
POSTGRES_TARGETS = ("e2e", "first_call", "many")


@pytest.mark.slow
def test_bench_quick_prints_every_row_with_its_target():
    argv = [sys.executable, "manage.py", "bench", "--quick"]
    rows, targets = ROW_NAMES, [target for target in TARGETS if target not in OPT_IN]
    database_url = os.environ.get("DATABASE_URL", "")
    if database_url.startswith("postgres"):
        argv += ["--database-url", database_url, "--only", *POSTGRES_PARTS]
        if os.environ.get("REDIS_URL"):
            argv += ["--redis-url", os.environ["REDIS_URL"]]
        rows = [name for names in POSTGRES_PARTS.values() for name in names]
        targets = POSTGRES_TARGETS
    started = time.monotonic()
    result = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-4000:]
    out = result.stdout
    for name in rows:
        assert name in out, f"row {name!r} missing:\n{out}"
    for target in targets:
        assert TARGETS[target] in out, f"target {TARGETS[target]!r} missing:\n{out}"
    assert out.count("PASS") + out.count("MISS") == len(targets)
    print(f"bench --quick took {elapsed:.0f} s")


def test_bench_only_names_the_parts_it_knows():
    result = subprocess.run(
        [sys.executable, "manage.py", "bench", "--only", "e2e", "everything"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert (
        "--only takes big, e2e, first_call, latency, scale, fairness, recovery, many, flow, prefix, big_answers; "
        "not everything." in result.stderr
    )


def test_bench_steps_follow_only():
    from tests.perf.bench_engine import Bench

    bench = Bench.__new__(Bench)
    names = [step.__name__ for step in bench.steps(["many", "scale", "e2e", "fairness"])]
    assert names == ["end_to_end", "scale_out", "fairness", "many_batches"]
    assert [step.__name__ for step in bench.steps()][:2] == ["upload_and_create", "big_run_and_rss"]
    assert "big_answers" not in [step.__name__ for step in bench.steps()]  # opt-in: --only big_answers
