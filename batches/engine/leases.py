"""This engine's hold on its records: renewed on a thread and a connection of its own, and
known without asking the database whether it still holds.

Measured across hosts (issue 54): every database step of the engine waited on
its one database thread, so an engine cut off from the database (or stopped
with SIGSTOP and thawed) went on starting records and calling the model while
its leases ran out and other engines ran the same records: 60-933 model calls
made twice. Now:

- `Leases` renews the engine's leases and its heartbeat (store.hold) every
  quarter of a lease, on its own thread and connection: a slow trip on the
  database thread never holds up a renewal, and so never makes a live
  engine look dead (liveness: a heartbeat a lease old is dead).
- `live()` is a clock check, no database: the last renewal that landed was
  sent less than half a lease ago. No other engine may take the records
  before a whole lease has passed since then (their leases and the
  heartbeat were written with it), so the half left is the margin for
  clocks between hosts and for calls already on their way to the gate. The
  engine starts no record and sends no call while it is not live
  (lanes, calls.caller.ModelCaller's `leased`), and drops the records it
  claimed ahead (runner.Engine._tend_leases).
- A renewal that finds the engine's row gone means another engine fenced it:
  `fenced` is set, and the engine starts again under a new name.
- The loop proves itself alive to this thread (`loop_seen`): an engine
  whose asyncio loop hangs stops renewing, and its records go to others
  when their leases run out, as they did before renewals had a thread.
"""

import logging
import threading
import time
from collections.abc import Callable

from django.db import DatabaseError, connections

from batches.engine import dbretry, store

logger = logging.getLogger("openrelay.engine")


class Leases:
    """One engine's renewals and the local clock that says whether they still hold."""

    def __init__(self, owner: str, lease_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.owner = owner
        self.lease_s = lease_s
        self.clock = clock
        self.renewed_at = clock()  # when the last renewal that landed was sent (a new engine: now)
        self.loop_seen = clock()  # when the engine's loop last said it turns (runner.Engine._tend_leases)
        self.batch_pks: list[int] = []  # the batches whose records it holds, as the loop last gave them
        self.fenced = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def live(self) -> bool:
        """Whether records may start and calls go out: a renewal landed within half a lease."""
        return not self.fenced and self.clock() - self.renewed_at < self.lease_s / 2

    def start(self) -> None:
        """Renew from now on (the engine's first heartbeat just wrote its row)."""
        self.renewed_at = self.loop_seen = self.clock()
        self._thread = threading.Thread(target=self._run, name="openrelay-leases", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            # Bounded: a renewal stuck on a database that went away (up to the connection's deadlines)
            # must not hold up the engine's stop; the thread is a daemon and its leases run out anyway.
            self._thread.join(timeout=self.lease_s)
            self._thread = None

    def _run(self) -> None:
        dbretry.engine_session()
        try:
            while True:
                self.renew()
                if self._stop.wait(self.lease_s / 4):
                    break
        finally:
            connections.close_all()  # this thread's own connection

    def renew(self) -> None:
        """One renewal: the engine's leases and heartbeat, if its loop still turns."""
        if self.fenced or self.clock() - self.loop_seen >= self.lease_s / 2:
            return  # fenced, or the loop is stuck: let the leases run out
        sent = self.clock()
        try:
            held = store.hold(self.owner, list(self.batch_pks), self.lease_s)
        except DatabaseError as exc:
            # The next one retries on a new connection; meanwhile the clock decides.
            logger.warning("engine %s could not renew its leases (%s)", self.owner, type(exc).__name__)
            dbretry.drop_connections()
            return
        if held:
            self.renewed_at = sent
        else:
            self.fenced = True
