"""A SIGKILLed `manage.py bench` leaves none of its processes behind (pytest-timeout kills it so).

Before openrelay/lib/children.py, 13 of the 16 processes a killed `bench --quick` had started
(simulators, the probe, uvicorn, the cluster) ran on under init for 6-11 minutes.
"""

import contextlib
import signal
import subprocess
import sys
import time

import psutil
import pytest

from openrelay.lib import children
from tests.helpers import ROOT, wait_for
from tests.processes import still_running


def cluster_running(bench):
    """True once the bench's qcluster has its sentinel, workers, pusher and monitor."""
    assert bench.poll() is None, "the bench ended before its cluster ran"
    for process in psutil.Process(bench.pid).children(recursive=True):
        try:
            if "qcluster" in process.cmdline() and len(process.children(recursive=True)) >= 5:
                return True
        except psutil.NoSuchProcess:
            pass
    return False


@pytest.mark.slow
def test_a_killed_bench_leaves_no_process_behind(tmp_path):
    log = open(tmp_path / "bench.log", "wb")
    bench = children.popen(
        [sys.executable, "manage.py", "bench", "--quick", "--only", "e2e"],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    started = []
    try:
        wait_for(lambda: cluster_running(bench), 180, "the bench's cluster to run")
        started = psutil.Process(bench.pid).children(recursive=True)
        assert len(started) >= 12  # 6 model servers, the web server, the cluster's 6 processes
        bench.send_signal(signal.SIGKILL)
        bench.wait(timeout=10)
        killed = time.monotonic()
        psutil.wait_procs(started, timeout=10)
        left = still_running(started)
        assert not left, f"{len(left)} of {len(started)} still running {time.monotonic() - killed:.0f} s on: {left}"
    finally:
        if bench.poll() is None:
            started = psutil.Process(bench.pid).children(recursive=True)
            bench.kill()
        for process in still_running(started):
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        bench.wait(timeout=10)
        log.close()
