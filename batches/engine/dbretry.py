"""Database calls that outlive a database restart.

A worker's database operations (claim, flush, renew, status checks) run on
its one database thread. When PostgreSQL restarts (a failover, an upgrade)
every open connection dies; without this the task would crash on the next
call and its batch would wait for the sweeper (two lease lengths) to be
handed out again. Instead the call drops the dead connection and is retried
with a fresh one, with backoff, for up to OPENRELAY_DB_OUTAGE_S.

Retrying is safe because every engine operation is one transaction that is
either idempotent (renew, status reads) or conditional on the lease it holds
(a flush whose commit did land before the connection died finds no record
still held, writes nothing and counts nothing the second time).
"""

import logging
import time

from django.conf import settings
from django.db import InterfaceError, OperationalError, connections

logger = logging.getLogger("openrelay.engine")

FIRST_DELAY_S = 0.1
MAX_DELAY_S = 2.0


def call(fn, *args):
    """fn(*args), retried on a lost database connection until the outage limit."""
    deadline = time.monotonic() + settings.OPENRELAY_DB_OUTAGE_S
    delay = FIRST_DELAY_S
    while True:
        try:
            return fn(*args)
        except (OperationalError, InterfaceError) as exc:
            if time.monotonic() + delay > deadline:
                raise
            logger.warning(
                "database unavailable (%s); retrying %s in %.1fs",
                type(exc).__name__,
                getattr(fn, "__name__", "a call"),
                delay,
            )
            _drop_connections()
            time.sleep(delay)
            delay = min(delay * 2, MAX_DELAY_S)


def _drop_connections():
    """Close this thread's connections (they are thread-local) so the next query opens a new one."""
    for connection in connections.all(initialized_only=True):
        try:
            connection.close()
        except Exception:  # noqa: BLE001 - closing a dead connection may fail too; it is dropped either way
            connection.connection = None
