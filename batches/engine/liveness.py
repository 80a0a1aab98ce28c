"""How engines learn within a second or two that one of them died, and take its records.

A lease (OPENRELAY_LEASE_S, 10 s) is the last resort: waiting it out cost a
kill -9 10-23 s before the dead engine's records ran again. Engines look
for each other's death with every heartbeat (0.5 s) instead:

- PostgreSQL: each engine holds a session advisory lock, keyed by its owner
  name, on a connection of its own. The server releases it the moment that
  connection drops (a killed process's socket is closed by its kernel), so
  an engine whose row is in the table but whose lock is free is dead. A
  slow engine keeps its lock however slow it is: it is never taken for
  dead. After a server restart every lock is free at once; an engine that
  has not beaten since the restart gets a lease (OPENRELAY_LEASE_S) to take
  its lock again before it counts as dead: no later than its leases would
  have run out, and engines retrying their connection (dbretry) take seconds.
- Elsewhere (SQLite, one machine): an engine on this host whose process is
  gone (or a zombie) is dead once its heartbeat is DEAD_PID_S old; one on
  another host once its heartbeat is OPENRELAY_ENGINE_DEAD_S old.
- Everywhere: an engine whose heartbeat is a lease old is dead, though its
  lock be held or its process live. A stopped process (SIGSTOP, a paused VM)
  keeps its connection and its pid: it was never fenced, and thawed it sent
  71-98 calls other engines had made already (issue 54). A live engine beats
  on a thread of its own (batches.engine.leases), so a slow trip does not
  make it look dead.

Fencing: the engine that finds another dead deletes its Engine row, only if
its heartbeat is still the one it read (compare-and-set), and in the same
transaction ends the leases of its running records and takes its name off
them, which the ordinary claim of expired records then takes first. The
shares it held go to the living at once (the dead row is gone from
heartbeat's count). The owner name is the fencing token: unique to one
engine's life (host:pid:random), on its row and on every record it holds.
Should the "dead" engine be alive after all, its results and checkpoints
cannot land (every write is conditional on lease_owner, no record carries
its name any more) and its next renewal or heartbeat finds its row gone
(store.Fenced): it drops everything it holds and starts again under a new
name.
"""

import hashlib
import math
import os
import socket
import time
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from batches.engine import store
from batches.engine.fairness import split
from batches.models import Batch, BatchStatus, Engine, Record, RecordStatus

# The advisory lock's first key: ours, so a row of pg_locks with another is someone else's.
LOCK_SPACE = 0x4F52454E  # "OREN"
# The batches whose records engines run (store.active_batches).
ACTIVE = (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS, BatchStatus.CANCELLING)
DEAD_PID_S = 1.0  # two missed heartbeats: guards against a host name shared across pid namespaces
# A cluster's engines die together (kill -9 of its process group, a host lost), but the server frees
# their locks moments apart: a reap that finds one dead looks again this much later, so one take-over
# splits all of their sent records. Taken over one at a time, the second's records came a call round
# late: the survivors had filled the calls the first freed (3.04 s re-sends where 0.3 s is usual).
MATES_S = 0.2


def lock_key(owner):
    """The engine's advisory lock's second key: 31 bits of a hash of its owner name."""
    return int.from_bytes(hashlib.blake2b(owner.encode(), digest_size=4).digest(), "big") >> 1


class Liveness:
    """One engine's proof of life and its look at the others (on the engine's database thread)."""

    def __init__(self, owner):
        self.owner = owner
        self.key = lock_key(owner)
        self.host = host_name()
        self.lock = None  # the psycopg connection holding our advisory lock (PostgreSQL)

    def beat(self, holding, first):
        """Hold our lock, reap the dead, then heartbeat: (live engines as store.heartbeat
        gives them, {batch pk: records of dead engines now claimable}, {deployment pk: the
        calls they held there})."""
        freed, limits = self.reap()
        live = store.heartbeat(self.owner, holding, host=self.host, pid=os.getpid(), first=first)
        return live, freed, limits

    def reap(self):
        now = timezone.now()
        rows = list(Engine.objects.exclude(owner=self.owner).values_list("owner", "host", "pid", "seen_at", "holding"))
        if connection.vendor == "postgresql":
            dead = self._dead_by_lock(rows, now)
            if dead and len(dead) < len(rows):
                time.sleep(MATES_S)  # its mates' locks (MATES_S)
                dead = self._dead_by_lock(rows, now)
        else:
            dead = [row for row in rows if self._dead_by_heartbeat(*row[1:4], now)]
        if dead:
            # Its mates in this pid namespace whose process is gone, however recent their last beat: found
            # a beat apart by their heartbeats, they were taken over one at a time (MATES_S).
            dead += [
                row for row in rows if row not in dead and row[1] == self.host and row[2] and not pid_alive(row[2])
            ]
        freed, limits = {}, {}
        # Who a take-over sets the sent records aside for: the engines left, less any whose process is
        # gone though its heartbeat is not yet a second old (the dead engine's cluster-mate, found dead
        # next beat): records set aside for it waited DESIGNATED_S (seen: 3.8-6.8 s re-sends).
        heirs = sorted(
            [self.owner]
            + [row[0] for row in rows if row not in dead and (row[1] != self.host or not row[2] or pid_alive(row[2]))]
        )
        for owner, _, _, seen, holding in dead:
            taken = take_over(owner, seen, now, heirs)
            if taken is None:
                continue  # it beat meanwhile, or another engine took it over
            for batch_pk, n in taken.items():
                freed[batch_pk] = freed.get(batch_pk, 0) + n
            # What it held of each deployment (at least its calls in flight there) is the living's now.
            for deployment, calls in (holding or {}).items():
                if calls:
                    limits[int(deployment)] = limits.get(int(deployment), 0) + calls
        return freed, limits

    def _dead_by_lock(self, rows, now):
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT objid::bigint FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2 "
                "AND classid = %s AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                [LOCK_SPACE],
            )
            held = {key for (key,) in cursor.fetchall()}
            cursor.execute("SELECT pg_postmaster_start_time()")
            (started,) = cursor.fetchone()
        if self.key not in held:
            self._hold()  # first beat, or our lock's connection dropped (a server restart)
        lease = timedelta(seconds=settings.OPENRELAY_LEASE_S)
        settled = now - started >= lease
        # An engine that beat since the server started held its lock then (it takes it before
        # it beats): a free lock now means its connection ended. A held lock proves only that
        # the connection lives: a stopped process (SIGSTOP, a VM paused) keeps it, so a heartbeat
        # older than a lease is dead too (issue 54: a paused engine was never fenced).
        return [
            row
            for row in rows
            if (lock_key(row[0]) not in held and (row[3] > started or settled)) or now - row[3] >= lease
        ]

    def _hold(self):
        import psycopg

        self.close()
        params = connection.get_connection_params()
        params.pop("cursor_factory", None)
        with connection.wrap_database_errors:  # Django's errors, so dbretry retries a lost server
            self.lock = psycopg.connect(**params, autocommit=True, application_name="openrelay-engine-liveness")
        # The server's side of a host that vanished (power, network): drop it, and the lock, within
        # seconds, not after the kernel's 2 h keepalive; but never sooner than half a lease after
        # the cut, when the engine itself has stopped its calls (batches.engine.leases): the
        # probes alone take `count` s, whenever the first one goes out.
        count = math.ceil(settings.OPENRELAY_LEASE_S / 2) + 1
        self.lock.execute(
            f"SET tcp_keepalives_idle = 2; SET tcp_keepalives_interval = 1; SET tcp_keepalives_count = {count}"
        )
        self.lock.execute(f"SET tcp_user_timeout = {(count + 2) * 1000}")
        (taken,) = self.lock.execute("SELECT pg_try_advisory_lock(%s, %s)", [LOCK_SPACE, self.key]).fetchone()
        if not taken:
            raise RuntimeError(f"engine {self.owner}: its liveness lock is held by another session")

    def _dead_by_heartbeat(self, host, pid, seen, now):
        missed = (now - seen).total_seconds()
        if missed >= settings.OPENRELAY_LEASE_S:
            return True  # its process may live, stopped (SIGSTOP): its leases ran out with its heartbeat
        if host == self.host and pid:
            # Its process answers for it: a live one, however slow, is never taken for dead
            # (one hung for good loses its records with its leases).
            return missed >= DEAD_PID_S and not pid_alive(pid)
        return missed >= settings.OPENRELAY_ENGINE_DEAD_S

    def close(self):
        if self.lock is not None:
            self.lock.close()
            self.lock = None


def host_name():
    """This engine's host as the others compare it: the machine's name and, where Linux says, its pid
    namespace, so "the same host" means a pid seen gone here is gone (containers may share a name)."""
    name = socket.gethostname()
    try:
        return f"{name} pidns:{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return name


def pid_alive(pid):
    """Whether process `pid` runs on this host (a zombie, killed and not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True  # no /proc (macOS): kill's answer stands


def take_over(owner, seen_at, now, heirs=None):
    """Fence a dead engine: delete its row if its heartbeat is still `seen_at`, and make its
    running records claimable now: the sent ones at once (their lease ended), the rest pending.
    Returns {batch pk: sent records freed} (0 for a batch it had only claimed ahead in), or None
    if it beat meanwhile or another engine took it over first."""
    with transaction.atomic():
        if not Engine.objects.filter(owner=owner, seen_at=seen_at).delete()[0]:
            return None
        # Through the running batches: lease_owner has no index of its own, (batch, status, line) serves this.
        active = Batch.objects.filter(status__in=ACTIVE).values("pk")
        records = Record.objects.filter(batch_id__in=active, status=RecordStatus.RUNNING, lease_owner=owner)
        freed = {}
        for batch_pk, sent in records.values_list("batch_id", "sent"):
            freed[batch_pk] = freed.get(batch_pk, 0) + sent
        # What it only claimed ahead (never marked sent: batches.engine.trips.SentMarks writes the
        # mark before a record's first call, and ahead for at most its calls at the model of a
        # batch's queue, which go first with those in flight) is ordinary work again: pending, for any engine, in
        # line order. Left running with the rest, 65 such records of a kill -9 took the head of
        # the line from the 16 really in flight (issue 55).
        records.filter(sent=False).update(status=RecordStatus.PENDING, lease_owner="", lease_expires_at=None)
        # The sent ones are split over the live engines in line order, a contiguous part each by
        # rank (fairness.split, as the shares they free are): each claims its part first when it
        # hears of the take-over (store._claim), so they go out at once over every survivor, not
        # all on whichever claims first. Its name comes off them too: the fencing token. Were the
        # engine alive after all (a paused process thawed), its flushes and checkpoints find no
        # record of its own, even before a live engine claims them again.
        live = heirs
        if live is None:
            live = list(
                Engine.objects.filter(seen_at__gte=now - timedelta(seconds=settings.OPENRELAY_LEASE_S))
                .order_by("owner")
                .values_list("owner", flat=True)
            )
        sent = list(records.order_by("batch_id", "line").values_list("batch_id", "pk"))
        expired = now - timedelta(seconds=1)
        for batch_pk in freed:
            pks = [pk for batch, pk in sent if batch == batch_pk]
            start = 0
            for rank, engine in enumerate(live):
                part = pks[start : start + split(len(pks), rank, len(live))]
                start += len(part)
                Record.objects.filter(pk__in=part).update(
                    lease_owner=store.designated(engine), lease_expires_at=expired
                )
        records.update(lease_owner="", lease_expires_at=expired)  # none live: anyone's
    return freed
