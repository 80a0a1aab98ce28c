"""The engine's database operations: claims with leases, the trip that flushes and claims, renewals.

All of these are synchronous and run on the worker's one database thread.
The database is the ledger: a record is someone's only while its lease
lives, and every write is conditional on still holding it, so a worker that
lost its lease (it stalled, the sweeper re-queued the record) can never
write a second outcome for the record. The flush's statements are
batches.engine.flushes; what a closed batch does with its unfinished records,
batches.engine.cut.
"""

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.db.models import QuerySet
from django.utils import timezone

from batches.engine import flushes
from batches.models import Batch, BatchStatus, Engine, Record, RecordStatus
from openrelay.core.models import Deployment


@dataclass
class ClaimedRecord:
    pk: int
    line: int
    custom_id: str
    offset: int
    length: int
    checkpoint: bytes | None = None  # the loop state a resumed multi-step record continues from
    twins: int = 0  # records waiting for its answer (batches.reuse): its flush settles them
    resumed: bool = False  # claimed because its lease ran out (its engine died)
    prefix: int | None = None  # its prompt prefix's key (batches.engine.prefixes), read with its line
    ahead: bool = False  # marked sent before its start, not called yet (batches.engine.trips.SentMarks)


_RUNNING = RecordStatus.RUNNING.value
# How long the records a take-over set aside for one engine wait for it before any engine may claim them.
DESIGNATED_S = 2.0
MAX_PART = 100_000  # the most records of its part a claim takes (a bound on the statement, not a limit)
_PENDING = RecordStatus.PENDING.value


def _q(name):
    return connection.ops.quote_name(name)


def trip(owner, outcomes, claims, lease_until, recover=False):
    """One trip to the database: flush finished records and claim more, in one transaction
    (one commit, one WAL flush), for any number of batches.

    `outcomes`: {batch pk: [(ClaimedRecord, RecordOutcome)]}; `claims`:
    {batch pk: (limit, after_line, expired)}, `expired`: how many of them may be
    records whose lease ran out (0: don't look; the caller looks about once a
    second a batch, and at once after a take-over: the look is one more statement). Claims go first: they are what idle
    slots wait for. `lease_until` is the caller's, fixed for the trip, so
    a retry after a lost connection (`recover`: the first attempt may have
    committed, its answer lost on the way back) takes back the records
    that attempt leased instead of leaving them to wait out their lease.
    Returns ({batch pk: written}, {batch pk: [ClaimedRecord] in line order}, {pks of the
    batches whose every record is now finished}): the engine that wrote a batch's last
    records closes it at once, without waiting for a poll to notice.
    """
    now = timezone.now()
    claimed = {}
    flushed = {pk: done for pk, done in outcomes.items() if done}
    with transaction.atomic():
        # The batch rows first (lock_batches says why), before the claims lock any record: a cancel
        # or an expiry (cut.close_unfinished) takes the batch row and then its records, so a trip that
        # claimed records before it took the batch row deadlocks with it (test_big_answers). A host
        # that vanishes mid-trip holds these rows until its session ends, after
        # OPENRELAY_DB_IDLE_IN_TRANSACTION_S (dbretry.deadlines; issue 54 measured a batch frozen
        # 163 s for every host without it); the others' trips wait OPENRELAY_DB_LOCK_TIMEOUT_S a try.
        lock_batches(flushed)
        for batch_pk, (limit, after_line, expired) in claims.items():
            records = _leased_until(batch_pk, owner, lease_until) if recover else []
            if limit > len(records):
                records += _claim(batch_pk, owner, limit - len(records), lease_until, after_line, now, expired)
            if records:
                records.sort(key=lambda record: record.line)
                claimed[batch_pk] = records
        written, finished = flushes.write(owner, flushed)
    return written, claimed, finished


def lock_batches(batch_pks):
    """Lock batch rows in id order, before any record row: every transaction that writes both
    (a flush, a claim with a flush, a cancellation's close) takes them in this order.

    Flushes took the batch rows after their claims had locked records, and a
    cancellation's close locked its records before it updated the batch: a
    claim of a dead engine's expired record, or a close, then waited for a batch
    row a flush held while the flush waited for that record (`deadlock detected`,
    seen twice by the issue 42 review). SQLite runs one writer at a time.
    """
    if batch_pks and connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT id FROM {_q(Batch._meta.db_table)} WHERE id = ANY(%s) ORDER BY id FOR UPDATE",
                [sorted(batch_pks)],
            )


def claim(batch_pk, owner, limit, lease_s=None, after_line=0):
    """Lease up to `limit` records of one batch to `owner` (trip's claim alone)."""
    if limit <= 0:
        return []
    lease_until = timezone.now() + timedelta(seconds=lease_s or settings.OPENRELAY_LEASE_S)
    return trip(owner, {}, {batch_pk: (limit, after_line, limit)}, lease_until)[1].get(batch_pk, [])


def _leased_until(batch_pk, owner, lease_until):
    rows = Record.objects.filter(
        batch_id=batch_pk, status=RecordStatus.RUNNING, lease_owner=owner, lease_expires_at=lease_until
    ).values_list("pk", "line", "custom_id", "offset", "length", "checkpoint", "twins")
    return [ClaimedRecord(*row) for row in rows]


def _claim(batch_pk, owner, limit, lease_until, after_line, now, expired=0):
    """Records whose lease ran out (their engine died with their calls in flight), at most
    `expired` of them, come first, in line order: they are the batch's oldest work, and left for
    last they would hold up its end. Then
    pending records from past `after_line` (the caller's cursor: the line of
    the last record it claimed, so a claim never walks the batch's finished
    lines again). When neither is left, the whole batch is searched once
    more (a record handed back by a stopping engine may sit behind the
    cursor). One UPDATE ... RETURNING per kind: no rows read back, no model
    instances."""
    if limit <= 0:
        # LIMIT -1 is an error on PostgreSQL and "no limit" on SQLite (the whole batch).
        return []
    ops = connection.ops
    lease_until = ops.adapt_datetimefield_value(lease_until)
    records = []
    if expired:
        # A take-over's part for this engine first, whatever the cap (liveness.take_over), then any
        # other whose lease ran out, except the parts it set aside for other engines, for
        # DESIGNATED_S (theirs to claim first; one that never does leaves them to anyone).
        at = ops.adapt_datetimefield_value(now)
        # All of its part: they were in flight, and a part claimed a chunk at a time let the dead
        # engine's pending lines, claimed beside it, start first.
        rows = _claim_where(
            batch_pk, owner, MAX_PART, lease_until, "status = %s AND lease_owner = %s", [_RUNNING, designated(owner)]
        )
        if len(rows) < limit:
            rows += _claim_where(
                batch_pk,
                owner,
                min(limit - len(rows), expired),
                lease_until,
                "status = %s AND lease_expires_at < %s AND (lease_owner NOT LIKE %s OR lease_expires_at < %s)",
                [_RUNNING, at, "~%", ops.adapt_datetimefield_value(now - timedelta(seconds=DESIGNATED_S))],
            )
        records = [ClaimedRecord(*row, resumed=True) for row in rows]
    if len(records) < limit:
        rows = _claim_where(
            batch_pk, owner, limit - len(records), lease_until, "status = %s AND line > %s", [_PENDING, after_line]
        )
        records += [ClaimedRecord(*row) for row in rows]
    if not records and after_line:
        records = [
            ClaimedRecord(*row) for row in _claim_where(batch_pk, owner, limit, lease_until, "status = %s", [_PENDING])
        ]
    records.sort(key=lambda record: record.line)
    return records


def designated(owner):
    """The lease owner a take-over writes on the records it sets aside for `owner` to claim
    (liveness.take_over): no engine's name, so nothing is written under it but by that claim."""
    return f"~{owner}"[:64]


def _claim_where(batch_pk, owner, limit, lease_until, condition, params):
    table = _q(Record._meta.db_table)
    returning = ", ".join(_q(c) for c in ("id", "line", "custom_id", "offset", "length", "checkpoint", "twins"))
    pick = f"SELECT id FROM {table} WHERE batch_id = %s AND {condition} ORDER BY line LIMIT %s"
    # `sent` cleared: the new holder marks it again before the record's first call (mark_sent).
    sets = "status = %s, lease_owner = %s, lease_expires_at = %s, sent = %s, attempts = attempts + 1"
    if connection.vendor == "postgresql":
        # SKIP LOCKED lets several workers claim disjoint chunks of one batch
        # at once; the CTE runs the locking pick exactly once.
        sql = (
            f"WITH picked AS ({pick} FOR UPDATE SKIP LOCKED) UPDATE {table} AS r SET {sets} FROM picked "
            f"WHERE r.id = picked.id RETURNING " + ", ".join(f"r.{c}" for c in returning.split(", "))
        )
        args = [batch_pk, *params, limit, _RUNNING, owner, lease_until, False]
    else:
        # SQLite serialises writers (IMMEDIATE transactions): the pick and
        # the update cannot interleave with another worker's.
        sql = f"UPDATE {table} SET {sets} WHERE id IN ({pick}) RETURNING {returning}"
        args = [_RUNNING, owner, lease_until, False, batch_pk, *params, limit]
    with connection.cursor() as cursor:
        cursor.execute(sql, args)
        return cursor.fetchall()


class Fenced(Exception):
    """Another engine took this one for dead and took its records (batches.engine.liveness)."""


def heartbeat(owner, holding, *, host="", pid=0, lease_s=None, first=True):
    """Prove `owner` alive and publish what it holds of each deployment; return the live
    engines as [(owner, holding, calls)], sorted by owner (an engine's rank is its place;
    `calls` is what each published last with batches.tallies, its adaptive limits among them).

    An engine found dead (batches.engine.liveness), or whose heartbeat is older
    than one lease, is out: its records are claimable again, and what it held
    goes back to the others. After its `first` beat an engine whose row is gone
    was fenced: Fenced is raised, and nothing is written.
    """
    now = timezone.now()
    lease_s = lease_s or settings.OPENRELAY_LEASE_S
    fields = {"seen_at": now, "holding": holding, "host": host[:100], "pid": pid}
    if first:
        Engine.objects.update_or_create(owner=owner, defaults=fields)
        return _beat_rows(None, now, lease_s)
    live = _beat_rows(fields | {"owner": owner}, now, lease_s)
    if live is None:
        raise Fenced(owner)
    return live


def _beat_rows(fields, now, lease_s):
    """A beat's statements as SQL of their own (the Engine table has no relations to collect):
    the beat's row written (None when `fields` found no row: fenced), the rows of engines long
    dead (kill -9) dropped by whoever looks, the live ones read. Twice a second an engine, the
    ORM's querysets (an update, a delete's collector, a read) cost ~2.9 ms of CPU a beat on a
    loaded 2-core machine, ~0.8 ms so (issue 55: the gateway's CPU a record)."""
    table, ops = _q(Engine._meta.db_table), connection.ops
    field = Engine._meta.get_field
    with connection.cursor() as cursor:
        if fields is not None:
            cursor.execute(
                f"UPDATE {table} SET seen_at = %s, holding = %s, host = %s, pid = %s WHERE owner = %s",
                [
                    ops.adapt_datetimefield_value(fields["seen_at"]),
                    field("holding").get_db_prep_save(fields["holding"], connection),
                    fields["host"],
                    fields["pid"],
                    fields["owner"],
                ],
            )
            if not cursor.rowcount:
                return None
        cursor.execute(
            f"DELETE FROM {table} WHERE seen_at < %s",
            [ops.adapt_datetimefield_value(now - timedelta(seconds=20 * lease_s))],
        )
        cursor.execute(
            f"SELECT owner, holding, calls FROM {table} WHERE seen_at >= %s ORDER BY owner",
            [ops.adapt_datetimefield_value(now - timedelta(seconds=lease_s))],
        )
        rows = cursor.fetchall()
    holding, calls = field("holding"), field("calls")
    return [
        (owner, holding.from_db_value(held, None, connection), calls.from_db_value(made, None, connection))
        for owner, held, made in rows
    ]


def renew(owner, batch_pks, lease_s=None):
    """Extend the leases of `owner`'s running records of `batch_pks`.

    On PostgreSQL a record row another transaction holds is skipped: it is being written (a flush,
    most often a flush apart of big answers, which holds its rows for seconds) or closed, and the
    next renewal takes it if that write rolls back. Waiting for it, the renewal of every batch of
    the engine waited past OPENRELAY_DB_LOCK_TIMEOUT_S and failed, and an engine whose renewals
    fail for half a lease starts no call (issue 55: another organization's 20 records took 59 s
    beside flushes apart of 134 MB answers; the one-worker run logged 14 failed renewals)."""
    if not batch_pks:
        return
    until = timezone.now() + timedelta(seconds=lease_s or settings.OPENRELAY_LEASE_S)
    mine = Record.objects.filter(batch_id__in=batch_pks, status=RecordStatus.RUNNING, lease_owner=owner)
    if connection.vendor == "postgresql":
        mine = Record.objects.filter(pk__in=mine.select_for_update(skip_locked=True).values("pk"))
    mine.update(lease_expires_at=until)


def hold(owner: str, batch_pks: list[int], lease_s: float | None = None) -> bool:
    """Renew `owner`'s leases and its heartbeat in one transaction (batches.engine.leases, on a
    connection of its own). False, and nothing renewed, when its row is gone: it was fenced."""
    with transaction.atomic():
        if not Engine.objects.filter(owner=owner).update(seen_at=timezone.now()):
            return False
        renew(owner, batch_pks, lease_s)
    return True


def retire(owner):
    """A clean stop: the engine row goes, so the others take its shares at once."""
    Engine.objects.filter(owner=owner).delete()


def release(owner, pks):
    """Give records back unfinished (this engine is stopping): pending again, for any engine."""
    if not pks:
        return 0
    return Record.objects.filter(pk__in=pks, lease_owner=owner, status=RecordStatus.RUNNING).update(
        status=RecordStatus.PENDING, lease_owner="", lease_expires_at=None
    )


def mark_sent(owner, pks):
    """Mark records `owner` is about to start as sent (their first model call may go out next);
    return the pks it still holds. One statement for the group a turn of the loop started and
    the records they mark ahead (trips.SentMarks): what a take-over reads to tell records in flight from those claimed ahead."""
    if not pks:
        return set()
    table = _q(Record._meta.db_table)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                f"UPDATE {table} SET sent = TRUE WHERE id = ANY(%s) AND lease_owner = %s AND status = %s RETURNING id",
                [list(pks), owner, _RUNNING],
            )
        else:
            cursor.execute(
                f"UPDATE {table} SET sent = 1 WHERE id IN ({', '.join(['%s'] * len(pks))}) "
                f"AND lease_owner = %s AND status = %s RETURNING id",
                [*pks, owner, _RUNNING],
            )
        return {pk for (pk,) in cursor.fetchall()}


def save_checkpoints(owner, states):
    """Store records' loop states ({pk: bytes}) while `owner` still holds them running; return
    the pks written (one statement on PostgreSQL, one transaction of small UPDATEs otherwise)."""
    if not states:
        return set()
    table = _q(Record._meta.db_table)
    pks, data = list(states), list(states.values())
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                f"UPDATE {table} AS r SET checkpoint = v.data FROM unnest(%s::bigint[], %s::bytea[]) AS v(id, data) "
                f"WHERE r.id = v.id AND r.lease_owner = %s AND r.status = %s RETURNING r.id",
                [pks, data, owner, _RUNNING],
            )
            return {pk for (pk,) in cursor.fetchall()}
        held = set()
        for pk, blob in states.items():
            cursor.execute(
                f"UPDATE {table} SET checkpoint = %s WHERE id = %s AND lease_owner = %s AND status = %s",
                [blob, pk, owner, _RUNNING],
            )
            if cursor.rowcount:
                held.add(pk)
        return held


def active_batches(only=None):
    """The batches engines work or close: validating, in progress and cancelling, with what
    the engine needs of each (one query; the engine reads it every poll, POLL_S).

    `only` (an engine driven for given batches: runner.run_batch) filters the rows here, so
    every engine runs the one compiled statement."""
    rows = _ACTIVE_BATCHES.rows()
    if only is not None:
        rows = [row for row in rows if row["pk"] in only]
    return rows


def _active_batches_query():
    return Batch.objects.filter(
        status__in=(BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS, BatchStatus.CANCELLING)
    ).values(
        "pk",
        "public_id",
        "status",
        "organization_id",
        "model_id",
        "model_name",
        "endpoint",
        "priority",
        "created_at",
        "expires_at",
        "input_file_id",
        "total_count",
        "completed_count",
        "failed_count",
        "organization__workflows_enabled",
        "organization__max_concurrency",
        # Guardrails (batches.engine.spend, batches.engine.breaker): the pause, the cap and what was spent, the breaker.
        "paused_at",
        "max_cost_nanos",
        "input_tokens",
        "cached_tokens",
        "output_tokens",
        "unbilled_input_tokens",
        "unbilled_cached_tokens",
        "unbilled_output_tokens",
        "price_input",
        "price_cached_input",
        "price_output",
        "price_multiplier",
        "breaker_window",
        "breaker_failures",
        "breaker_consecutive",
        "model__max_output_tokens",
        "organization__monthly_budget",
        "output_contract",
    )


class CompiledValues:
    """A fixed `.values()` queryset compiled to SQL once per database connection, then run as
    that statement: the rows are the queryset's own (its fields' converters applied).

    For the statements an engine runs on a clock whatever its load: building and compiling
    the batches' poll (joins, 35 columns) cost ~1 ms of CPU a call, 5 calls a second an
    engine, against ~0.1 ms to run it (issue 55: the gateway's CPU a record)."""

    def __init__(self, make: Callable[[], QuerySet[Any, dict[str, Any]]]) -> None:
        self.make = make
        # A connection's own compiler (the converters take the connection): a thread has its own connection.
        self.compiled: weakref.WeakKeyDictionary[Any, tuple[Any, str, tuple[Any, ...], list[str]]] = (
            weakref.WeakKeyDictionary()
        )

    def rows(self) -> list[dict[str, Any]]:
        wrapper = connections[DEFAULT_DB_ALIAS]
        compiled = self.compiled.get(wrapper)
        if compiled is None:
            queryset = self.make()
            query = queryset.query
            compiler = query.get_compiler(using=DEFAULT_DB_ALIAS)
            sql, params = compiler.as_sql()
            names = [*query.extra_select, *query.values_select, *query.annotation_select]
            compiled = self.compiled[wrapper] = (compiler, sql, tuple(params), names)
        compiler, sql, params, names = compiled
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            fetched = cursor.fetchall()
        return [dict(zip(names, row, strict=True)) for row in compiler.results_iter(results=[fetched])]


_ACTIVE_BATCHES = CompiledValues(_active_batches_query)


def watched(owner=None):
    """(the newest batch's id, the engines' rows, the other engines' latest refusal): engines watch
    these to start a new batch at once, to claim their part of what an engine that left held, and
    to stop slow start where another engine was just refused (`refusals`) (primary-key index
    lookups over a few rows, one statement, ~30 us)."""
    engines = _q(Engine._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT (SELECT MAX(id) FROM {_q(Batch._meta.db_table)}), (SELECT COUNT(*) FROM {engines}), "
            f"(SELECT MAX(refused_at) FROM {engines} WHERE owner <> %s)",
            [owner or ""],
        )
        return tuple(cursor.fetchone())


def tell_refused(owner, refused):
    """This engine's {deployment pk: when a server there last refused it a call after none had, epoch
    seconds}, for the other engines' watch (Engine.refused)."""
    Engine.objects.filter(owner=owner).update(
        refused={str(pk): when for pk, when in refused.items()}, refused_at=timezone.now()
    )


def refusals(owner):
    """{deployment pk: the latest refusal there of the other engines (epoch seconds)}."""
    latest = {}
    for refused in Engine.objects.exclude(owner=owner).exclude(refused=None).values_list("refused", flat=True):
        for pk, when in (refused or {}).items():
            latest[int(pk)] = max(when, latest.get(int(pk), when))
    return latest


def deployments(model_ids):
    """Enabled deployments of enabled models, by model id."""
    by_model = {}
    rows = Deployment.objects.filter(model_id__in=model_ids, enabled=True, model__enabled=True).values(
        "pk",
        "model_id",
        "base_url",
        "upstream_model",
        "api_key",
        "max_concurrency",
        "messages_api",
        "health",
        "health_changed_at",
        "needs_canary",
        "last_error",
        "model__name",
    )
    for row in rows:
        by_model.setdefault(row["model_id"], []).append(row)
    return by_model


def save_health(deployment_id, health, changed_at, last_error, needs_canary=False):
    Deployment.objects.filter(pk=deployment_id).update(
        health=health, health_changed_at=changed_at, last_error=last_error, needs_canary=needs_canary
    )


def flush(batch_pk, owner, outcomes):
    """Store finished records and roll their counts and usage up into the batch.

    `outcomes` is a list of (ClaimedRecord, RecordOutcome). Returns how many
    were written (records whose lease this worker no longer holds are skipped).

    No model instances and no per-row CASE expressions (bulk_update's way,
    which cost ~1.2 ms a record): PostgreSQL takes one statement that updates
    from arrays and rolls up from what it updated; other backends one
    conditional executemany.
    """
    if not outcomes:
        return 0
    with transaction.atomic():
        lock_batches([batch_pk])
        return flushes.write(owner, {batch_pk: outcomes})[0].get(batch_pk, 0)
