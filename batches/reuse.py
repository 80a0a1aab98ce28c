"""Reuse: identical records of a batch run once (docs/guides/reuse.md).

At create, `Twins` (a RecordChecker wrapper) keys each accepted record by its request: the
batch's endpoint and the body with its keys sorted (the model is in the body; custom_id is not).
The first record of a key is its **leader**; each later one is a **twin**, stored `waiting` with
its leader's line (`Record.leader_line`). Engines never claim a twin. The flush that writes a
leader's outcome writes its twins' in the same transaction (`settle`): the same status, answer or
error, each under its own custom_id, with a marker of whom it reused (`Record.reused_from`, the
result line's `openrelay` object). So a kill -9 leaves no twin without its answer: a leader that
was not flushed is claimed again when its lease runs out, and its twins wait for it.

A leader that fails fails its twins the same way: the request is the same, so the same answer
(an error one included) is what a run of the twin would most likely get, and a twin run again
would be a model call the user asked not to pay for. `retry_failed` retries them all.

Which records are merged is the batch's `openrelay.reuse` mode: "auto" (the default) merges
deterministic requests only (the endpoint's `Endpoint.deterministic`: temperature 0 or a seed, one
answer; embeddings and moderations always), "identical" every identical body (one sample for all),
"cache" as "auto" (and answers from the organization's earlier batches, batches.answer_cache),
"off" none. Tool-calling and workflow records are never merged: their tools have effects.
"""

import hashlib

import orjson
from django.conf import settings
from django.db import connection

from batches.models import Batch, Record, RecordStatus

MODES = ("auto", "identical", "cache", "off")
DEFAULT_MODE = "auto"
_NEVER_MERGED = ("tool_config", "workflow")  # openrelay extensions whose runs have effects

_WAITING = RecordStatus.WAITING.value
_SETTLED = (RecordStatus.SUCCEEDED.value, RecordStatus.FAILED.value)


def request_key(spec, body, mode):
    """The key identical requests share (16 bytes), or None when this record is never merged."""
    if mode == "off":
        return None
    extensions = body.get("openrelay")
    if isinstance(extensions, dict) and any(key in extensions for key in _NEVER_MERGED):
        return None
    if mode != "identical" and not spec.deterministic(body):
        return None
    canonical = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(spec.path.encode() + b"\n" + canonical, digest_size=16).digest()


class Twins:
    """A RecordChecker that also finds each accepted record's leader: `leader_of` {twin line: leader
    line} and `twins_of` {leader line: its twins}. Rejected records take part in nothing."""

    def __init__(self, checker, mode):
        self.checker, self.mode = checker, mode
        self.leaders = {}  # request key -> line of its first record
        self.keys = {}  # leader line -> request key (the answer cache stores leaders by it)
        self.leader_of = {}
        self.twins_of = {}

    def __getattr__(self, name):
        return getattr(self.checker, name)

    def check(self, obj, line):
        custom_id = self.checker.check(obj, line)
        key = request_key(self.checker.spec, obj["body"], self.mode)
        if key is not None:
            leader = self.leaders.setdefault(key, line)
            if leader == line:
                self.keys[line] = key
            else:
                self.leader_of[line] = leader
                self.twins_of[leader] = self.twins_of.get(leader, 0) + 1
        return custom_id

    def row_state(self, line):
        """(status, leader line) a new record row of this line takes."""
        leader = self.leader_of.get(line)
        return (RecordStatus.PENDING.value, None) if leader is None else (_WAITING, leader)


def mark_leaders(batch_pk, twins_of):
    """Tell each leader its count of twins (what makes its flush settle them): in create's transaction."""
    if not twins_of:
        return
    table = connection.ops.quote_name(Record._meta.db_table)
    with connection.cursor() as cursor:
        cursor.executemany(
            f"UPDATE {table} SET twins = %s WHERE batch_id = %s AND line = %s",
            [(n, batch_pk, line) for line, n in twins_of.items()],
        )


def bill_share_permille():
    """What a reused answer bills, in thousandths of its original's tokens (OPENRELAY_REUSE_BILL_SHARE)."""
    return round(settings.OPENRELAY_REUSE_BILL_SHARE * 1000)


def settle(leader_pks):
    """Write the outcome of each of these leaders (already written, in this transaction) to its
    waiting twins, and roll them up into their batches. Returns the pks of the batches now finished.

    In the flush's transaction, which holds the batch rows (store.lock_batches): a cancel's close
    (cut.close_unfinished) or another engine's flush of the same leader waits for it, and finds
    the twins settled. A leader not finished (its lease was lost) settles nothing; one another
    engine finished settled its twins then.
    """
    if not leader_pks:
        return set()
    q = connection.ops.quote_name
    record, batch = q(Record._meta.db_table), q(Batch._meta.db_table)
    share = bill_share_permille()
    marks = ", ".join(["%s"] * len(leader_pks))
    join = (
        f"l.id IN ({marks}) AND t.batch_id = l.batch_id AND t.leader_line = l.line "
        f"AND t.status = %s AND l.status IN (%s, %s)"
    )
    where = [*leader_pks, _WAITING, *_SETTLED]
    # A twin bills its leader's tokens * share // 1000 (integer division in both databases): the
    # same expression in the sums and the update, so the batch adds exactly what its rows say.
    billed = [f"l.{q(c)} * {share} / 1000" for c in _TOKENS]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # The flush turned nested loops off for its own join (flushes._flush_postgresql); this
            # one wants them: a few leaders by pk, each to its twins by the record_twins index.
            cursor.execute("SET LOCAL enable_nestloop = on")
        # What each batch's twins come to, read before they are written (SQLite's RETURNING can't
        # name the leader's columns).
        cursor.execute(
            f"SELECT t.batch_id, COUNT(*), SUM(CASE WHEN l.status = %s THEN 1 ELSE 0 END), "
            f"{', '.join(f'SUM({b})' for b in billed)}, SUM(l.prompt_tokens), SUM(l.completion_tokens) "
            f"FROM {record} AS t, {record} AS l WHERE {join} GROUP BY t.batch_id",
            [RecordStatus.SUCCEEDED.value, *where],
        )
        owed = cursor.fetchall()
        if not owed:
            return set()
        sets = ", ".join(f"{q(c)} = {b}" for c, b in zip(_TOKENS, billed, strict=True))
        cursor.execute(
            f"UPDATE {record} AS t SET status = l.status, status_code = l.status_code, request_id = l.request_id, "
            f"response_body = l.response_body, error_code = l.error_code, error_message = l.error_message, "
            f"finished_at = l.finished_at, reused_from = l.custom_id, {sets} FROM {record} AS l WHERE {join}",
            where,
        )
        finished = set()
        for batch_pk, n, succeeded, prompt, cached, completion, reasoning, original_in, original_out in owed:
            cursor.execute(
                _ROLL_UP_SQL.format(batch=batch),
                [
                    succeeded,
                    n - succeeded,
                    n,
                    prompt,
                    cached,
                    completion,
                    reasoning,
                    original_in - prompt,
                    original_out - completion,
                    batch_pk,
                ],
            )
            cursor.execute(
                f"SELECT completed_count + failed_count >= total_count FROM {batch} WHERE id = %s", [batch_pk]
            )
            if cursor.fetchone()[0]:
                finished.add(batch_pk)
    return finished


_TOKENS = ("prompt_tokens", "cached_tokens", "completion_tokens", "reasoning_tokens")
_ROLL_UP_SQL = (
    "UPDATE {batch} SET completed_count = completed_count + %s, failed_count = failed_count + %s, "
    "reused_count = reused_count + %s, input_tokens = input_tokens + %s, cached_tokens = cached_tokens + %s, "
    "output_tokens = output_tokens + %s, reasoning_tokens = reasoning_tokens + %s, "
    "reused_input_tokens = reused_input_tokens + %s, reused_output_tokens = reused_output_tokens + %s WHERE id = %s"
)
