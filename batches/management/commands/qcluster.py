"""`manage.py qcluster`: django-q2's, stopping cleanly however SIGTERM is delivered.

Why django-q2 1.11's own hangs when SIGTERM reaches every process at once
(systemd's default KillMode=control-group, `kill -TERM -- -<pgid>`): its
sentinel process resets SIGTERM to the default action, so the group's signal
kills it on the spot, most often while it sleeps in `stop_event.wait(1)` between
guard cycles. The main process's handler then calls `stop_event.set()`, and a
multiprocessing Condition's notify waits for every registered sleeper to
acknowledge its wake-up (synchronize.py: `self._woken_count.acquire()`). The
dead sentinel never will: the main process blocks there forever beside its
defunct sentinel (seen with gdb's py-bt). SIGINT worked only because the
sentinel ignores it.

So the sentinel must never die of SIGTERM: it is forked with SIGTERM blocked
(the mask, unlike the handler it installs, survives its `signal.signal`), and
so are the pusher and the monitor it forks. The main process unblocks it again,
and the workers do in post_spawn (batches/engine/process.py), where the
engine's handler stops the engine and exits. A group's SIGTERM thus reaches
the main process, whose handler sets the stop event for a living sentinel, and
the workers, which stop their engines: django-q2's ordered stop then finds
them gone and ends. SIGTERM to the main process alone goes the same way.

Before django-q2's ordered stop, the main process's handler raises the
cluster's stop flag (batches/engine/process.py, announce_stop): every engine
stops starting records within its 50 ms watch, where q2's STOP reaches a
worker only 2-4 s later.

The main process acts on the first SIGTERM or SIGINT only: a second one, while
the first is inside `stop_event.set()` (holding the Condition's non-reentrant
lock), would block on that lock forever.

Every process the cluster forks is SIGKILLed when its parent dies
(openrelay/lib/children.py): a kill -9 of qcluster leaves no sentinel or
worker behind.
"""

import signal

from django_q.management.commands import qcluster

from batches.engine import process
from openrelay.lib import children


class Command(qcluster.Command):
    def handle(self, *args, **options):
        children.forks_die_with_parent()
        process.share_stop()  # before the sentinel forks: its workers inherit the flag
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            # Builds the Cluster (whose handler takes SIGTERM and SIGINT), forks the sentinel
            # and returns once it runs; then this process waits for it in multiprocessing's atexit.
            super().handle(*args, **options)
        finally:
            _act_on_the_first_signal_only()
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def _act_on_the_first_signal_only():
    q2_handler = signal.getsignal(signal.SIGTERM)
    if not callable(q2_handler):
        return

    def handler(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        process.announce_stop()  # the engines stop starting records now, not at q2's STOP 2-4 s on
        q2_handler(signum, frame)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
