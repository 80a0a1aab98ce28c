"""`manage.py bench --quick` runs from end to end and prints every measurement (CI's only benchmark run).

The figures of a quick run mean nothing (500 records, tiny files, a shared
machine): this proves the command, its throwaway state and its processes
work. It runs on its own throwaway SQLite database whatever the suite's; `--database-url` and
`--redis-url` (PostgreSQL + Redis) are for a run by hand.
"""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.perf.bench_engine import OPT_IN, PARTS, TARGETS

ROOT = Path(__file__).resolve().parents[2]
ROW_NAMES = (
    "create",
    "upload",
    "end to end",
    "first batch",
    "first model call",
    "latency-bound",
    "finalize",
    "scale-out",
    "worker peak RSS",
    "fairness",
    "recovery",
    "many batches",
    "windows",
)


# The whole quick bench, on the bench's own throwaway SQLite database and ORM broker whatever the
# suite's: the tier db_independent (pyproject.toml), so CI runs it once, in the SQLite pass.
@pytest.mark.slow
@pytest.mark.long
@pytest.mark.timeout(660)  # the bench's own 600 s: ~110 s on a quiet 2-core machine, 300+ on a loaded one
def test_bench_quick_prints_every_row_with_its_target():
    argv = [sys.executable, "manage.py", "bench", "--quick"]
    opt_in_runs = {run for part in OPT_IN for run in PARTS[part]}
    targets = [target for target in TARGETS if target not in opt_in_runs]
    started = time.monotonic()
    result = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-4000:]
    out = result.stdout
    for name in ROW_NAMES:
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
    assert f"--only takes {', '.join(PARTS)}; not everything." in result.stderr


def test_bench_steps_follow_only():
    from tests.perf.bench_engine import Bench

    bench = Bench.__new__(Bench)
    names = [step.__name__ for step in bench.steps(["many", "scale", "e2e", "fairness"])]
    assert names == ["end_to_end", "scale_out", "fairness", "many_batches"]
    assert [step.__name__ for step in bench.steps()][:2] == ["upload_and_create", "big_run_and_rss"]
    assert "big_answers" not in [step.__name__ for step in bench.steps()]  # opt-in: --only big_answers


def test_bench_refusals_picks_a_part_of_row_18():
    from tests.perf.bench_flow import refusal_runs

    assert len(refusal_runs()) == 24
    assert refusal_runs(["q0", "2c", "after"]) == [("no queue", 0, "", 2, "after"), ("no queue", 0, "vllm", 2, "after")]
    assert {run[1] for run in refusal_runs(["q0", "q64", "vllm"])} == {0, 64}
    result = subprocess.run(
        [sys.executable, "manage.py", "bench", "--only", "refusals", "--refusals", "q0", "noqueue"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "not noqueue" in result.stderr
