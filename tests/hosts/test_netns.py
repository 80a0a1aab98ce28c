"""The namespaces' own housekeeping: what a crashed run left is swept, a live run's never."""

import subprocess

import psutil

from tests.hosts.netns import delete_namespace, ip, namespaces, run_prefix, sweep


def dead_pid():
    """A pid no process has now (one past the highest, unless that too is taken)."""
    pid = max(psutil.pids()) + 1000
    while psutil.pid_exists(pid):
        pid += 1
    return pid


def test_a_crashed_run_s_namespaces_and_their_processes_are_swept_and_a_live_run_s_kept():
    crashed, live = f"{run_prefix(dead_pid())}-db", f"{run_prefix(1)}-db"  # pid 1 always runs
    sleeper = None
    try:
        for name in (crashed, live):
            assert ip("netns", "add", name, check=False).returncode == 0
        # What a crash leaves: a process still running inside (a PostgreSQL as another user, say).
        sleeper = subprocess.Popen(["ip", "netns", "exec", crashed, "sleep", "600"])
        removed = sweep("orh0")  # no run has this prefix: this run's own topology is never touched
        assert crashed in removed and live not in removed
        assert crashed not in namespaces() and live in namespaces()
        assert sleeper.wait(timeout=10) == -9  # killed by the sweep, not left holding the namespace
    finally:
        for name in (crashed, live):
            delete_namespace(name)
        if sleeper and sleeper.poll() is None:
            sleeper.kill()
