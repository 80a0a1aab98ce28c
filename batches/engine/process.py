"""The engine in every django-q2 worker process.

django-q2 supervises the worker processes (starts them, brings back one
that died, stops them in order) and carries the short tasks: sweeps,
webhook deliveries, file expiry. Each worker process also runs one engine,
on a thread of its own, started when q2 spawns the process (post_spawn).

Why not a q2 task: a task holds its worker process until it returns, and
q2 cuts it at its timeout. Engines held as tasks would take every worker
from the sweeper and the deliveries, and a task's end or timeout would cut
the records in flight; the first engine, a task per batch, queued a
20-record batch for 94 s behind another organization's backlog. A thread
beside the task loop costs nothing of the sort: the main thread sits idle
in q2's queue most of the time.

Stops are clean whichever way they come:
- q2's own stop (SIGTERM or SIGINT to `qcluster`, what docker, Kubernetes
  and Ctrl-C send): qcluster's handler first raises the cluster's stop flag
  (announce_stop), which every worker's engine reads at its next watch
  (within ~50 ms) and stops on (Engine.request_stop: it starts no record,
  calls in flight finish within OPENRELAY_STOP_GRACE_S, the rest is handed
  back). Then q2's ordered stop: the sentinel hands each worker a STOP after
  its current task, 2-4 s later, and the worker's process exits (a
  multiprocessing finalizer waits for its engine). Until the flag, the
  engines went on starting records for those 2-4 s (58-72 calls at 40 a
  second in test_group_stops). A recycled worker leaves by the finalizer alone.
- SIGTERM to a worker process itself (q2's guard does it past a task's
  timeout; systemd's default KillMode and `kill -TERM -- -<pgid>` signal
  every process of the service): the same clean stop, then the process
  exits. Twice is the same as once.

Workers are forked with SIGTERM blocked (our `qcluster` command blocks it
for q2's sentinel, which would otherwise die of a group's SIGTERM and hang
the main process: batches/management/commands/qcluster.py says why); each
worker unblocks it here once its handler is in place.
"""

import asyncio
import ctypes
import logging
import multiprocessing
import os
import signal
import threading
import time
from multiprocessing.util import Finalize

from django.conf import settings

logger = logging.getLogger("openrelay.engine")

RESTART_AFTER_S = 1.0
EXIT_WITHIN_S = 5.0
_state = {"engine": None, "thread": None, "stopping": False}
# The cluster's stop flag: shared memory that qcluster's main process creates before it forks the
# sentinel (which forks the workers), so every worker reads what the main process writes. A flag,
# not a multiprocessing.Event: setting an Event waits for every sleeper on it to wake, and a
# killed worker never would (the hang batches/management/commands/qcluster.py describes).
_cluster_stop = None


def share_stop():
    """In qcluster's main process, before the cluster forks: the flag its workers will read."""
    global _cluster_stop
    _cluster_stop = multiprocessing.RawValue(ctypes.c_bool, False)


def announce_stop():
    """In qcluster's main process, at its first SIGTERM or SIGINT: every engine stops starting records."""
    if _cluster_stop is not None:
        _cluster_stop.value = True


def cluster_stopping():
    """Whether this worker's cluster is stopping (always False outside a qcluster's workers)."""
    return _cluster_stop is not None and _cluster_stop.value


def on_spawn(sender=None, proc_name="", **kwargs):
    """django-q2's post_spawn: a worker process starts; give it its engine."""
    if settings.OPENRELAY_ENGINE:
        start()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def start():
    thread = threading.Thread(target=_run, name="openrelay-engine", daemon=True)
    _state["thread"] = thread
    thread.start()
    signal.signal(signal.SIGTERM, _on_sigterm)
    Finalize(None, stop, exitpriority=100)


def _run():
    from batches.engine.runner import Engine

    # A worker q2 brings back while the cluster stops starts no engine.
    while not (_state["stopping"] or cluster_stopping()):
        engine = _state["engine"] = Engine(stop_heard=cluster_stopping)
        try:
            asyncio.run(engine.run())
        except Exception:
            # A bug must not leave the process without an engine for the rest of its life.
            logger.exception("the engine stopped on an error; starting a new one")
            time.sleep(RESTART_AFTER_S)
        else:
            if not (_state["stopping"] or cluster_stopping()):
                logger.error("the engine returned without being asked to stop; starting a new one")


def stop():
    """Stop this process's engine cleanly and wait for it (at most the grace period and a margin)."""
    _state["stopping"] = True
    thread = _state["thread"]
    deadline = time.monotonic() + settings.OPENRELAY_STOP_GRACE_S + 15
    # Asked again until the thread ends: Engine.request_stop does nothing until the engine's loop
    # runs, so a stop that came while the engine was starting (a SIGTERM just after the worker
    # spawned) was lost, and the join waited out its whole 25 s (seen in 1 of 8 group-SIGTERM runs).
    # A second request is a no-op (_begin_stop).
    while True:
        if (engine := _state["engine"]) is not None:
            engine.request_stop()
        if thread is None or thread is threading.current_thread() or not thread.is_alive():
            return
        if time.monotonic() > deadline:
            return
        thread.join(timeout=0.1)


def _on_sigterm(signum, frame):
    if _state["stopping"]:
        return  # a second SIGTERM, or one during q2's own stop: the stop under way goes on
    stop()
    # Leave by SystemExit, not os._exit: an idle worker waits in the task queue's `get` holding the
    # queue's read lock (shared by every worker), and only unwinding that `with` releases it. Left
    # held, the workers q2 brings back never read a task or their STOP, and the cluster's next stop
    # hangs (CI: a group SIGTERM as the engines started). The timer ends the process should the
    # exception be swallowed or the exit's own clean-up block.
    deadline = threading.Timer(EXIT_WITHIN_S, os._exit, (0,))
    deadline.daemon = True
    deadline.start()
    raise SystemExit(0)
