"""Sends a worker process's webhook deliveries off the thread that asked for them.

Deliveries used to run inline on the engine's closer thread: an organization's
20 endpoints that never answer, 4 of its batches closing, held every other
organization's close behind them (a batch with every record done stayed
in_progress 158 s), and the minute sweep with it. Now the closer, the sweeps
and the delivery tasks hand the delivery rows (written in the transaction that
ended the batch) to this sender and return at once.

Bounds, so one organization's hanging endpoints can't starve another's events:
- OPENRELAY_WEBHOOK_CONCURRENCY threads per process (each attempt
  runs the `deliver` the sender was made with, services.deliver_pk: at most
  OPENRELAY_WEBHOOK_TIMEOUT_S on the wire);
- at most OPENRELAY_WEBHOOK_ORG_CONCURRENCY of one organization's deliveries
  in that pool at once; the rest wait in the organization's own queue, not
  the pool's, so another organization's delivery takes the next free thread.

A process that dies with deliveries queued here loses nothing: the rows are
pending, and the retry sweep (tasks.deliver_due) sends them once due. So the
threads are daemons: a worker process that stops does not wait for endpoints
(concurrent.futures' pool would join its threads at exit, every queued attempt
run first, each up to the timeout).

The sender is given its `deliver` callable rather than importing services, which
imports it: the arrow runs one way (services -> sender).
"""

import logging
import threading
from collections import Counter, defaultdict, deque
from queue import SimpleQueue

from django.conf import settings
from django.db import connections

logger = logging.getLogger("webhooks")


class Sender:
    def __init__(self, deliver, *, threads, per_org):
        self.deliver = deliver  # deliver(pk, first_only=...): one attempt of one delivery
        self.per_org = per_org
        self._jobs = SimpleQueue()  # (organization id, pk, first_only), each with its organization's slot
        self._lock = threading.Lock()
        self._sending = Counter()  # organization id -> its deliveries in the pool
        self._waiting = defaultdict(deque)  # organization id -> its pks waiting for a slot of theirs
        self._held = set()  # pks in the pool or waiting: a sweep hands none over twice
        for n in range(threads):
            threading.Thread(target=self._work, name=f"openrelay-webhooks-{n}", daemon=True).start()

    def submit(self, org_id, pk, first_only):
        """Queue one delivery's attempt; False if this process holds it already."""
        with self._lock:
            if pk in self._held:
                return False
            self._held.add(pk)
            if self._sending[org_id] < self.per_org:
                self._sending[org_id] += 1
                self._jobs.put((org_id, pk, first_only))
            else:
                self._waiting[org_id].append((pk, first_only))
        return True

    def _work(self):
        while True:
            self._send(*self._jobs.get())

    def _send(self, org_id, pk, first_only):
        try:
            self.deliver(pk, first_only=first_only)
        except Exception:
            logger.exception("webhook delivery %s failed on an error; the retry sweep tries again", pk)
        finally:
            connections.close_all()  # this pool thread's own connection: no idle ones held per thread
            self._next(org_id, pk)

    def _next(self, org_id, pk):
        with self._lock:
            self._held.discard(pk)
            waiting = self._waiting[org_id]
            if waiting:
                self._jobs.put((org_id, *waiting.popleft()))
                return
            del self._waiting[org_id]
            self._sending[org_id] -= 1
            if not self._sending[org_id]:
                del self._sending[org_id]


_sender = {"instance": None}
_sender_lock = threading.Lock()


def sender(deliver):
    """This process's sender, made on first use with `deliver` (webhooks.services.submit passes its deliver_pk)."""
    with _sender_lock:
        if _sender["instance"] is None:
            _sender["instance"] = Sender(
                deliver,
                threads=settings.OPENRELAY_WEBHOOK_CONCURRENCY,
                per_org=settings.OPENRELAY_WEBHOOK_ORG_CONCURRENCY,
            )
        return _sender["instance"]
