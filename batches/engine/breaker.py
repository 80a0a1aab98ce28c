"""The error breaker as an engine keeps it: its batches' failures judged as records end and at the flush.

Each flushed outcome is judged: a model's 4xx answer (but 401/403,
408, 429) or a record-level engine failure is the batch's; a deployment's
failure (5xx, connection errors, time limits) is never. `consecutive` of the
batch's own failures in a row with one code, as records end in this engine,
trip it; so do `failures` of the first `window` finished records with one
code (read from the database, every engine's records, while the batch is
inside its window).

The rules are the batch's (batches.guardrails.Breaker, fixed at create);
the pause is written by the engine's Guard (batches.engine.spend).
"""

from collections import Counter

import orjson

from batches.models import Record, RecordStatus

# Answers that say nothing about the batch's own requests: the deployment's or the server's load.
NOT_THE_BATCHS_STATUSES = {401, 403, 408, 429}
# Record failures the engine writes for the deployment's faults, not the record's.
DEPLOYMENT_CODES = {"upstream_error", "request_time_limit", "internal_error", "lease_lost"}


class Breakers:
    """The breakers of an engine's batches: each one's run of failures here, and which are past their window."""

    def __init__(self):
        self.streaks = {}  # batch pk -> (code, failures in a row)
        self.window_done = set()  # batches past their breaker window (or judged there)

    def forget(self, pk):
        self.streaks.pop(pk, None)
        self.window_done.discard(pk)

    def suspect(self, spend, done):
        """Should the first-records rule of the batch be judged after this flush of its outcomes?"""
        rules = spend.breaker
        if spend.paused or not (rules.window and rules.failures) or spend.pk in self.window_done:
            return False
        return any(failure_of(outcome) not in (None, SUCCEEDED) for _, outcome in done)

    def judged(self, pk, done):
        if done:
            self.window_done.add(pk)

    def ended(self, spend, record, outcome):
        """A record ended here: the in-a-row rule's detail when it trips the breaker, else None."""
        consecutive = spend.breaker.consecutive
        if outcome is None or not consecutive or spend.paused:
            return None
        key = failure_of(outcome)
        if key is None:
            return None  # a deployment's failure: it neither counts nor breaks a run
        code, count = self.streaks.get(spend.pk, ("", 0))
        code, count = ("", 0) if key is SUCCEEDED else (key[0], count + 1 if key[0] == code else 1)
        self.streaks[spend.pk] = (code, count)
        if count >= consecutive:
            return _breaker_detail(key, record.line, record.custom_id, count, f"{count} records in a row")
        return None


SUCCEEDED = ("",)


def failure_of(outcome):
    """SUCCEEDED, (code, status_code, message) for a failure that is the batch's own, or None."""
    if outcome.succeeded:
        return SUCCEEDED
    status = outcome.status_code
    if status is None:
        if outcome.error_code in DEPLOYMENT_CODES or not outcome.error_code:
            return None
        return outcome.error_code, None, outcome.error_message
    if not 400 <= status < 500 or status in NOT_THE_BATCHS_STATUSES:
        return None
    error = outcome.body.get("error") if isinstance(outcome.body, dict) else None
    error = error if isinstance(error, dict) else {}
    code = error.get("code") or error.get("type") or "error"
    return f"{status} {code}"[:80], status, str(error.get("message") or "")[:500]


def judge_window(batch_pk, window, failures):
    """(db thread) The first `window` finished records of the batch, by when they finished:
    (the breaker's detail if `failures` of them share one code, whether the window is full)."""
    rows = list(
        Record.objects.filter(batch_id=batch_pk, status__in=(RecordStatus.SUCCEEDED, RecordStatus.FAILED))
        .order_by("finished_at", "line")
        .values_list("line", "custom_id", "status", "status_code", "error_code", "error_message", "response_body")[
            :window
        ]
    )
    counts, first = Counter(), {}
    for line, custom_id, status, status_code, error_code, message, body in rows:
        key = failure_of(_outcome_of(status, status_code, error_code, message, body))
        if key is None or key is SUCCEEDED:
            continue
        counts[key[0]] += 1
        first.setdefault(key[0], (key, line, custom_id))
    for code, count in counts.most_common(1):
        if count >= failures:
            key, line, custom_id = first[code]
            return _breaker_detail(key, line, custom_id, count, f"{count} of its first {len(rows)} records"), True
    return None, len(rows) >= window


def _outcome_of(status, status_code, error_code, message, body):
    from batches.engine.outcomes import RecordOutcome

    parsed = None
    if body:
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError:
            parsed = None
    return RecordOutcome(status == RecordStatus.SUCCEEDED, status_code, "", parsed, error_code, message)


def _breaker_detail(key, line, custom_id, count, how_many):
    code, status, message = key
    return {
        "code": code,
        "message": f"{how_many} failed with '{code}'; the batch itself looks wrong, so it is paused instead of "
        f"running the rest into the error file. Example (line {line}): {message}".strip(),
        "line": line,
        "custom_id": custom_id,
        "failures": count,
    }
