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

Deadlines (issue 54): a call to a server that vanished (a network cut, a
lost host) used to hang, so the outage limit never applied. Every
connection carries libpq's connect timeout, keepalives and TCP user timeout
(openrelay/settings.py); the engine's own sessions (`engine_session` marks
the threads they run on) add the server's side: `deadlines` sets them when
the connection opens. A transaction an engine left open ends after
OPENRELAY_DB_IDLE_IN_TRANSACTION_S (freeing the rows it locked for
every other engine), a statement waits OPENRELAY_DB_LOCK_TIMEOUT_S for a lock
at most (then this module retries it), and the server drops the session of a
client that stopped answering within seconds.
"""

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings
from django.db import InterfaceError, OperationalError, connections
from django.db.backends.signals import connection_created

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
            drop_connections()
            time.sleep(delay)
            delay = min(delay * 2, MAX_DELAY_S)


def drop_connections() -> None:
    """Close this thread's connections (they are thread-local) so the next query opens a new one."""
    for connection in connections.all(initialized_only=True):
        try:
            connection.close()
        except Exception:  # noqa: BLE001 - closing a dead connection may fail too; it is dropped either way
            connection.connection = None


_thread = threading.local()


def engine_session() -> None:
    """Mark this thread's connections as an engine's (a ThreadPoolExecutor initializer):
    each gets the server-side deadlines when it opens."""
    _thread.engine = True


def shut(thread: ThreadPoolExecutor) -> None:
    """Stop an engine's database thread, its connections closed on it first: Django's are per
    thread, and left open they lived on until the process ended (a session of the database's
    held per engine that ever ran; PostgreSQL refused to drop a test database for them)."""
    thread.submit(connections.close_all)
    thread.shutdown(wait=True)


def deadlines():
    """The SET statements of an engine's session: the server's half of its clock."""
    idle_s = settings.OPENRELAY_DB_KEEPALIVE_IDLE_S
    interval_s = settings.OPENRELAY_DB_KEEPALIVE_INTERVAL_S
    count = settings.OPENRELAY_DB_KEEPALIVE_COUNT
    return (
        f"SET idle_in_transaction_session_timeout = {round(settings.OPENRELAY_DB_IDLE_IN_TRANSACTION_S * 1000)}; "
        f"SET lock_timeout = {round(settings.OPENRELAY_DB_LOCK_TIMEOUT_S * 1000)}; "
        f"SET tcp_keepalives_idle = {idle_s}; SET tcp_keepalives_interval = {interval_s}; "
        f"SET tcp_keepalives_count = {count}; "
        f"SET tcp_user_timeout = {settings.OPENRELAY_DB_TCP_USER_TIMEOUT_S * 1000}"
    )


def _set_deadlines(sender, connection, **kwargs):
    if getattr(_thread, "engine", False) and connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(deadlines())


connection_created.connect(_set_deadlines, dispatch_uid="openrelay-engine-deadlines")
