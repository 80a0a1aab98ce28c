"""Child processes that die with their parent, however the parent dies.

Every process the product or its tools start goes through here: `manage.py up`'s
web server, workers and simulator, the benchmarks' servers and clusters, the
tests' clusters and servers, and every process `qcluster` forks (its sentinel,
whose workers, pusher and monitor inherit the rule). A parent that is killed
(kill -9, pytest-timeout, the OOM killer) runs no cleanup of its own: before
this, a SIGKILLed `manage.py bench --quick` left 13 of its 16 processes running
under init for 6-11 minutes.

How: Linux's PR_SET_PDEATHSIG, set in the child between fork and exec. The
kernel itself sends the signal when the parent dies; it survives exec and
setsid, and costs no process and no thread. The other way, a watchdog process
per parent reading a pipe until EOF and then killing the process groups it was
told about, costs a process per parent, kills by process-group numbers that can
go stale and be reused, and is itself killed along with its parent's group (or
left behind, if it is not). Measured on a loaded 2-core box: Popen and wait of
/bin/true take 2.9 ms with the preexec_fn below, 0.9 ms without (a preexec_fn
turns off vfork), median of 40; a child is gone 1.8 ms (median, 2.6 max of 10)
after its parent's SIGKILL.

What to know:
- The signal comes when the *thread* that started the child ends. Start
  children from a thread that lives as long as they should (every caller here
  starts them from its main thread).
- It reaches the child alone, not the child's own children: a program that
  forks children of its own sets the rule for them (`forks_die_with_parent`;
  qcluster does). Programs that exec children (uvicorn, the simulator) start
  none in our set-ups.
- A parent that died between the fork and the prctl never triggers it: the
  child then checks that its parent is still the one that forked it.
- Other systems (macOS) have no PR_SET_PDEATHSIG: there the children outlive
  a killed parent, as they would anywhere without it.
"""

import ctypes
import os
import signal
import subprocess
from collections.abc import Callable
from typing import Any

PR_SET_PDEATHSIG = 1


def _libc_prctl() -> Callable[..., int] | None:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None  # not Linux


# Looked up once, in the parent: the child between fork and exec only calls it.
_prctl = _libc_prctl()


def die_with_parent(parent_pid: int, sig: int = signal.SIGKILL) -> None:
    """In a child process: be sent `sig` when the parent `parent_pid` dies."""
    if _prctl is None:
        return
    _prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before the prctl: no signal will come
        os.kill(os.getpid(), sig)


def popen(argv: Any, *, death_signal: int = signal.SIGKILL, **kwargs: Any) -> subprocess.Popen[Any]:
    """subprocess.Popen(argv, **kwargs) whose child is sent `death_signal` when this process dies.

    SIGKILL by default: a killed tool's servers are throwaway. `manage.py up` asks for
    SIGTERM, so its workers hand their records back first.
    """
    parent = os.getpid()
    return subprocess.Popen(argv, preexec_fn=lambda: die_with_parent(parent, death_signal), **kwargs)


def run(argv: Any, *, death_signal: int = signal.SIGKILL, **kwargs: Any) -> subprocess.CompletedProcess[Any]:
    """subprocess.run(argv, **kwargs) whose child is sent `death_signal` when this process dies."""
    parent = os.getpid()
    return subprocess.run(argv, preexec_fn=lambda: die_with_parent(parent, death_signal), **kwargs)


def forks_die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Every process this one forks from now on, and every process they fork, is sent `sig`
    when the process that forked it dies (os.fork and multiprocessing's fork; not subprocess)."""
    forked_by = [os.getpid()]

    def before() -> None:
        forked_by[0] = os.getpid()

    os.register_at_fork(before=before, after_in_child=lambda: die_with_parent(forked_by[0], sig))
