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
from datetime import timedelta
from typing import NamedTuple

import orjson
from django.conf import settings
from django.db import connection
from django.db.models import F, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from batches.models import Batch, Record, RecordStatus
from openrelay.core.models import Deployment

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
        """(status, leader line, request key) a new record row of this line takes: a "cache" batch's
        leaders keep their key, for later batches to find their answers by."""
        leader = self.leader_of.get(line)
        if leader is not None:
            return _WAITING, leader, None
        key = self.keys.get(line) if self.mode == "cache" else None
        return RecordStatus.PENDING.value, None, key.hex() if key is not None else None


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


# ---------------------------------------------------------------------------
# The answer cache: "cache" batches answer from their organization's earlier batches


def deployments_key(model_pk):
    """The model's enabled deployments and what each calls upstream, as one string: a cached answer
    is reused only between batches whose model was served by the same ones."""
    rows = Deployment.objects.filter(model_id=model_pk, enabled=True).values_list("pk", "upstream_model")
    return ",".join(sorted(f"{pk}:{upstream}" for pk, upstream in rows))[:1000]


def cache_ttl_s(organization):
    ttl = organization.reuse_cache_ttl_s
    return settings.OPENRELAY_REUSE_CACHE_TTL_S if ttl is None else ttl


_LOOKUP_CHUNK = 500  # keys a lookup statement (SQLite takes 32,766 parameters a statement)


def answer_from_cache(batch, twins):
    """Answer the leaders of a new "cache" batch (and their twins) whose request an earlier batch of
    its organization answered successfully, from that answer, without a model call: in create's
    transaction, so the engines never see them pending. Returns the lines answered.

    A source is a leader of an earlier "cache" batch (only those keep a request key) of the same
    organization, model and deployments (`deployments_key`), that succeeded within the TTL on a
    call of its own (not itself a cache hit: an answer's age is its call's), and whose batch still
    has its input and output files: a user who deleted them must not get their answers back.
    """
    if batch.reuse != "cache" or not twins.keys:
        return set()
    ttl = cache_ttl_s(batch.organization)
    if ttl <= 0:
        return set()
    sources = _sources(batch, {key.hex(): line for line, key in twins.keys.items()}, ttl)
    if not sources:
        return set()
    share = bill_share_permille()
    q = connection.ops.quote_name
    record = q(Record._meta.db_table)
    billed = ", ".join(f"{q(c)} = s.{q(c)} * {share} / 1000" for c in _TOKENS)
    now_at = timezone.now()
    now = connection.ops.adapt_datetimefield_value(now_at)
    counts = [0, 0, 0, 0, 0]  # lines answered; their billed prompt, cached, completion, reasoning tokens
    saved = [0, 0]  # the input and output tokens they did not cost
    with connection.cursor() as cursor:
        cursor.executemany(
            f"UPDATE {record} AS t SET status = s.status, status_code = s.status_code, request_id = s.request_id, "
            f"response_body = s.response_body, error_code = '', error_message = '', finished_at = %s, "
            f"reused_from = s.custom_id, reused_batch = %s, request_key = NULL, twins = 0, {billed} "
            f"FROM {record} AS s WHERE s.id = %s AND t.batch_id = %s AND (t.line = %s OR t.leader_line = %s)",
            [(now, source.batch, source.pk, batch.pk, line, line) for line, source in sources.items()],
        )
    for line, source in sources.items():
        n = 1 + twins.twins_of.get(line, 0)
        counts[0] += n
        for i, tokens in enumerate(source.tokens):
            counts[1 + i] += n * (tokens * share // 1000)
        saved[0] += n * (source.tokens[0] - source.tokens[0] * share // 1000)
        saved[1] += n * (source.tokens[2] - source.tokens[2] * share // 1000)
    Batch.objects.filter(pk=batch.pk).update(
        first_result_at=Coalesce("first_result_at", Value(now_at)),
        completed_count=F("completed_count") + counts[0],
        reused_count=F("reused_count") + counts[0],
        cache_hit_count=F("cache_hit_count") + counts[0],
        input_tokens=F("input_tokens") + counts[1],
        cached_tokens=F("cached_tokens") + counts[2],
        output_tokens=F("output_tokens") + counts[3],
        reasoning_tokens=F("reasoning_tokens") + counts[4],
        reused_input_tokens=F("reused_input_tokens") + saved[0],
        reused_output_tokens=F("reused_output_tokens") + saved[1],
    )
    return set(sources)


class _Source(NamedTuple):
    pk: int
    batch: str  # its batch's public id
    tokens: tuple  # what its call cost: prompt, cached, completion, reasoning tokens
    finished_at: object


def _sources(batch, lines_by_key, ttl):
    """{leader line: _Source}: the newest answer of each key the cache holds for this batch."""
    since = timezone.now() - timedelta(seconds=ttl)
    earlier = Batch.objects.filter(
        organization_id=batch.organization_id,
        model_id=batch.model_id,
        reuse="cache",
        deployments_key=batch.deployments_key,
        input_file__isnull=False,
        output_file__isnull=False,
    ).exclude(pk=batch.pk)
    keys = list(lines_by_key)
    found = {}
    for start in range(0, len(keys), _LOOKUP_CHUNK):
        rows = (
            Record.objects.filter(
                request_key__in=keys[start : start + _LOOKUP_CHUNK],
                batch__in=earlier,
                status=RecordStatus.SUCCEEDED,
                reused_batch="",
                finished_at__gte=since,
            )
            .values_list(
                "request_key",
                "pk",
                "batch__public_id",
                "prompt_tokens",
                "cached_tokens",
                "completion_tokens",
                "reasoning_tokens",
                "finished_at",
            )
            .order_by()
        )
        for key, pk, public_id, *tokens, finished_at in rows:
            source = _Source(pk, public_id, tuple(tokens), finished_at)
            line = lines_by_key[key]
            if line not in found or finished_at > found[line].finished_at:
                found[line] = source
    return found
