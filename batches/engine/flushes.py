"""The flush: finished records' outcomes written to their rows and rolled up into their batches.

The roll-up also sets a batch's first_result_at, once (COALESCE): the finish time of the first
flush that wrote any of its records (batches.latency).

Called inside a transaction that holds the batch rows (batches.engine.store.trip
and store.flush lock them first); every write is conditional on the lease, so a
record this engine no longer holds is skipped. PostgreSQL takes one statement
that updates from arrays and rolls up from what it updated; other backends one
conditional executemany a batch.
"""

import functools
import logging
from typing import NamedTuple

import orjson
from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connection, transaction
from django.utils import timezone

from batches import reuse
from batches.engine.calls.answer_text import AnswerText
from batches.models import Batch, Record, RecordStatus

logger = logging.getLogger("openrelay.engine")


class ResultRow(NamedTuple):
    """One record's outcome as the flush writes it: its fields are the Record columns it sets
    (`id` picks the row). A tuple, so the columns travel to PostgreSQL as arrays (zip(*rows))."""

    id: int
    status: str
    status_code: int | None
    request_id: str
    response_body: bytes | bytearray  # JSON text (UTF-8): sent as it is, never made a str on PostgreSQL
    error_code: str
    error_message: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    usage_implausible: int
    reasks: int  # re-asks its output contract made (batches.engine.loops.contract)
    # Usage of answers it got but is not billed for (RecordOutcome.unbilled).
    unbilled_prompt_tokens: int
    unbilled_cached_tokens: int
    unbilled_completion_tokens: int


_RESULT_COLUMNS = ResultRow._fields
# Each column's PostgreSQL type, in ResultRow's order (the arrays are cast to these).
_PG_TYPES = (
    "bigint",
    "text",
    "integer",
    "text",
    "text",
    "text",
    "text",
    "bigint",
    "bigint",
    "bigint",
    "bigint",
    "smallint",
    "smallint",
    "bigint",
    "bigint",
    "bigint",
)
_SUCCEEDED = RecordStatus.SUCCEEDED.value
_FAILED = RecordStatus.FAILED.value
_RUNNING = RecordStatus.RUNNING.value
# Batch total <- record column.
_ROLL_UP = (
    ("input_tokens", "prompt_tokens"),
    ("cached_tokens", "cached_tokens"),
    ("output_tokens", "completion_tokens"),
    ("reasoning_tokens", "reasoning_tokens"),
    ("implausible_usage_count", "usage_implausible"),
    ("reasks_count", "reasks"),
    ("unbilled_input_tokens", "unbilled_prompt_tokens"),
    ("unbilled_cached_tokens", "unbilled_cached_tokens"),
    ("unbilled_output_tokens", "unbilled_completion_tokens"),
)
# The error code of a record its output contract could not fix (batches.engine.loops.contract).
_INVALID_OUTPUT = "invalid_output"


def _q(name):
    return connection.ops.quote_name(name)


def write(owner, outcomes):
    """Write the outcomes of several batches: ({batch pk: records written}, {pks of the
    batches now finished}), one statement per OPENRELAY_FLUSH_MAX_BYTES of results."""
    if not outcomes:
        return {}, set()
    finished_at = connection.ops.adapt_datetimefield_value(timezone.now())
    written, finished = dict.fromkeys(outcomes, 0), set()
    statements = 0
    for chunk in _chunks(outcomes):
        statements += 1
        _add(written, finished, _write_isolating(owner, chunk, finished_at))
    if statements > 1:
        logger.info("flush of %d records split into %d statements", sum(map(len, outcomes.values())), statements)
    # The twins of the leaders just written take their answers in this same transaction: a crash
    # leaves either both or neither (batches.reuse).
    finished |= reuse.settle([claimed.pk for done in outcomes.values() for claimed, _ in done if claimed.twins])
    return written, finished


# A result whose JSON text passes this can't be sent (PostgreSQL refuses a message over 1 GB,
# and a text value over 1 GB): it fails as unstorable. Answers are capped far below by default.
MAX_RESULT_CHARS = 900 * 1024 * 1024


def _chunks(outcomes):
    """Lists of (batch pk, result row) carrying at most OPENRELAY_FLUSH_MAX_BYTES of result text
    each (a larger result goes alone). Rows are made as their chunk is reached: a chunk's texts
    are freed before the next one's are made.

    Measured before the split (issue 42): one flush of several 130 MB embeddings
    answers passed PostgreSQL's 1 GB message limit (`invalid message length`), the
    connection died, and the engines retried the same flush and calls in a loop.
    """
    limit = settings.OPENRELAY_FLUSH_MAX_BYTES
    chunk, size = [], 0
    for pk, done in outcomes.items():
        for claimed, outcome in done:
            row = _result_row(claimed.pk, outcome)
            chars = len(row.response_body)
            if chars > MAX_RESULT_CHARS:
                row = _unstorable(row, f"its {chars}-character result is larger than the database takes")
            if chunk and size + len(row.response_body) > limit:
                yield chunk
                chunk, size = [], 0
            chunk.append((pk, row))
            size += len(row.response_body)
    if chunk:
        yield chunk


def _write_isolating(owner, chunk, finished_at):
    """Write a chunk in a savepoint. When the database refuses it, each of its rows is written
    alone, and a row refused alone is written failed (`result_not_stored`), not billed: one
    record that breaks a flush no longer fails it (the engine died on it and ran the same
    calls again on every restart)."""
    try:
        with transaction.atomic():
            return _write(owner, chunk, finished_at)
    except (OperationalError, InterfaceError):
        raise  # a lost connection: dbretry's to retry
    except (DatabaseError, ValueError, OverflowError) as exc:
        if len(chunk) > 1:
            written, finished = {}, set()
            for item in chunk:
                _add(written, finished, _write_isolating(owner, [item], finished_at))
            return written, finished
        (pk, row) = chunk[0]
        logger.error("record %s of batch %s could not be stored: %s", row.id, pk, type(exc).__name__)
        return _write(owner, [(pk, _unstorable(row, type(exc).__name__))], finished_at)


def _write(owner, chunk, finished_at):
    if connection.vendor == "postgresql":
        return _flush_postgresql(owner, [row for _, row in chunk], sorted({pk for pk, _ in chunk}), finished_at)
    # SQLite runs one writer at a time: there is no lock order to keep.
    by_batch = {}
    for pk, row in chunk:
        by_batch.setdefault(pk, []).append(row)
    written, finished = {}, set()
    for pk, rows in by_batch.items():
        written[pk], now_finished = _flush_executemany(pk, owner, rows, finished_at)
        if now_finished:
            finished.add(pk)
    return written, finished


def _add(written, finished, result):
    for pk, n in result[0].items():
        written[pk] = written.get(pk, 0) + n
    finished |= result[1]


def _unstorable(row, reason):
    """A result row the database refused, as a failed record without its result: billed nothing, its
    usage kept as unbilled (it still counts against the batch's max_cost and the budget), unless
    that usage is what no column holds."""
    message = f"The record's result could not be stored ({reason}); it is not billed."
    unbilled = (
        row.prompt_tokens + row.unbilled_prompt_tokens,
        row.cached_tokens + row.unbilled_cached_tokens,
        row.completion_tokens + row.unbilled_completion_tokens,
    )
    if not all(0 <= n < _BIGINT_END for n in unbilled):
        unbilled = (0, 0, 0)
    return ResultRow(
        row.id, _FAILED, None, row.request_id, b"", "result_not_stored", message, 0, 0, 0, 0, 0, 0, *unbilled
    )


_BIGINT_END = 2**63  # a bigint column holds less


def _result_row(pk, outcome):
    usage = outcome.usage
    return ResultRow(
        pk,
        _SUCCEEDED if outcome.succeeded else _FAILED,
        outcome.status_code,
        outcome.request_id,
        _json_text(outcome.body),
        outcome.error_code,
        outcome.error_message,
        usage.prompt_tokens,
        usage.cached_tokens,
        usage.completion_tokens,
        usage.reasoning_tokens,
        1 if usage.implausible else 0,
        outcome.reasks,
        outcome.unbilled.prompt_tokens,
        outcome.unbilled.cached_tokens,
        outcome.unbilled.completion_tokens,
    )


def _json_text(body):
    """A result's JSON text: an answer kept as text (answer_text) is its bytes, not a copy."""
    if body is None:
        return b""
    if isinstance(body, AnswerText):
        return body.text
    return orjson.dumps(body)


@functools.cache
def _text_bytes():
    """A psycopg dumper that sends UTF-8 bytes as a text value in binary, as they are: a str is
    encoded to bytes first (a copy), and then copied again into the array."""
    from psycopg import postgres
    from psycopg.adapt import Dumper
    from psycopg.pq import Format

    class TextBytes(Dumper):
        format = Format.BINARY
        oid = postgres.types["text"].oid

        def dump(self, obj):
            return obj

    return TextBytes


def _flush_postgresql(owner, rows, batch_pks, finished_at):
    """Every batch's records in one statement, rolled up into each batch's row.

    The batch rows are locked first (lock_batches), in id order: engines flushing
    overlapping batches one statement each (in their own orders, holding
    each row to the commit) deadlocked, and PostgreSQL broke each tie only
    after its 1 s deadlock_timeout (15 stalls in one run of 100 batches on
    two engines); the same engines then queued behind each other's trips.
    """
    record, batch = _q(Record._meta.db_table), _q(Batch._meta.db_table)
    values = ", ".join(f"%b::{t}[]" for t in _PG_TYPES)  # %b: the arrays travel in binary, unescaped
    names = ", ".join(_RESULT_COLUMNS)
    sets = ", ".join(f"{_q(c)} = v.{c}" for c in _RESULT_COLUMNS[1:])
    totals = ", ".join(f"SUM({column}) AS {column}" for _, column in _ROLL_UP)
    sums = ", ".join(f"{_q(total)} = b.{_q(total)} + t.{column}" for total, column in _ROLL_UP)
    sql = (
        f"WITH v AS (SELECT * FROM unnest({values}) AS v({names})), "
        f"written AS (UPDATE {record} AS r SET {sets}, finished_at = %s, lease_owner = '', lease_expires_at = NULL, "
        f"checkpoint = NULL "
        f"FROM v WHERE r.id = v.id AND r.id = ANY(%b::bigint[]) AND r.batch_id = ANY(%b::bigint[]) "
        f"AND r.lease_owner = %s AND r.status = %s "
        f"RETURNING r.batch_id, r.status, {', '.join(f'r.{column}' for _, column in _ROLL_UP)}, r.error_code), "
        f"t AS (SELECT batch_id, COUNT(*) AS n, COUNT(*) FILTER (WHERE status = %s) AS succeeded, {totals}, "
        f"COUNT(*) FILTER (WHERE reasks > 0) AS reasked, COUNT(*) FILTER (WHERE error_code = %s) AS invalid "
        f"FROM written GROUP BY batch_id) "
        f"UPDATE {batch} AS b SET completed_count = b.completed_count + t.succeeded, "
        f"failed_count = b.failed_count + t.n - t.succeeded, {sums}, "
        f"reasked_count = b.reasked_count + t.reasked, invalid_output_count = b.invalid_output_count + t.invalid, "
        f"first_result_at = COALESCE(b.first_result_at, %s) "
        f"FROM t WHERE b.id = t.batch_id "
        f"RETURNING b.id, t.n, b.completed_count + b.failed_count >= b.total_count"
    )
    columns = [list(column) for column in zip(*rows)]
    import psycopg

    connection.ensure_connection()
    # Server-side binding, arrays in binary: Django's cursors bind on the
    # client, which quotes every body into the SQL text (a regex escape per
    # value): that was most of a flush's cost.
    # wrap_database_errors: psycopg's errors become Django's, as from any
    # Django cursor (dbretry retries a lost connection by Django's classes).
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
        # The results' texts are bytes (ResultRow.response_body): text values on this cursor only.
        cursor.adapters.register_dumper(bytes, _text_bytes())
        cursor.adapters.register_dumper(bytearray, _text_bytes())
        # A hash join of the arrays with the batches' running rows. Left to
        # itself, the planner trusted the stale statistics of a table this
        # churned ("running and ours": 1 row) and chose a nested loop that
        # re-read the arrays once per record: 30 ms a flush of 256, growing.
        cursor.execute("SET LOCAL enable_nestloop = off")
        cursor.execute(
            sql,
            [*columns, finished_at, columns[0], batch_pks, owner, _RUNNING, _SUCCEEDED, _INVALID_OUTPUT, finished_at],
        )
        rows = cursor.fetchall()
    return {pk: n for pk, n, _ in rows}, {pk for pk, _, finished in rows if finished}


class _LostLeases(Exception):
    pass


def _flush_executemany(batch_pk, owner, rows, finished_at):
    """One conditional executemany; when it wrote every row (the common case) that is all.
    Returns (records written, whether the batch's every record is now finished).

    When some leases were lost (rowcount short), the savepoint is rolled
    back and the rows still held are written alone, so the roll-up counts
    exactly what was written. SQLite runs write transactions one at a time
    (IMMEDIATE), so what is found held is still held when written.
    """
    record = _q(Record._meta.db_table)
    sets = ", ".join(f"{_q(c)} = %s" for c in _RESULT_COLUMNS[1:])
    update = (
        f"UPDATE {record} SET {sets}, finished_at = %s, lease_owner = '', lease_expires_at = NULL, "
        f"checkpoint = NULL WHERE id = %s AND lease_owner = %s AND status = %s"
    )

    def params(rows):
        # SQLite stores a str as text (bytes would be a blob): one row's text decoded at a time.
        return [(*row[1:4], row.response_body.decode(), *row[5:], finished_at, row.id, owner, _RUNNING) for row in rows]

    with connection.cursor() as cursor:
        try:
            with transaction.atomic():
                cursor.executemany(update, params(rows))
                if cursor.rowcount != len(rows):
                    raise _LostLeases
        except _LostLeases:
            ids = [row.id for row in rows]
            cursor.execute(
                f"SELECT id FROM {record} WHERE id IN ({', '.join(['%s'] * len(ids))}) AND lease_owner = %s AND status = %s",
                [*ids, owner, _RUNNING],
            )
            held = {pk for (pk,) in cursor.fetchall()}
            rows = [row for row in rows if row.id in held]
            if not rows:
                return 0, False
            cursor.executemany(update, params(rows))
        succeeded = sum(1 for row in rows if row.status == _SUCCEEDED)
        sums = [sum(getattr(row, column) for row in rows) for _, column in _ROLL_UP]
        reasked = sum(1 for row in rows if row.reasks)
        invalid = sum(1 for row in rows if row.error_code == _INVALID_OUTPUT)
        totals = ", ".join(f"{_q(total)} = {_q(total)} + %s" for total, _ in _ROLL_UP)
        cursor.execute(
            f"UPDATE {_q(Batch._meta.db_table)} SET completed_count = completed_count + %s, "
            f"failed_count = failed_count + %s, {totals}, reasked_count = reasked_count + %s, "
            f"invalid_output_count = invalid_output_count + %s, first_result_at = COALESCE(first_result_at, %s) "
            f"WHERE id = %s",
            [succeeded, len(rows) - succeeded, *sums, reasked, invalid, finished_at, batch_pk],
        )
        cursor.execute(
            f"SELECT completed_count + failed_count >= total_count FROM {_q(Batch._meta.db_table)} WHERE id = %s",
            [batch_pk],
        )
        (finished,) = cursor.fetchone()
    return len(rows), bool(finished)
