"""What an engine counts as it works, and publishes with its heartbeat.

Two figures, two homes:
- `Engine.calls` (the operator page and GET /metrics sum the live engines'
  rows): each deployment's calls in flight here, those of the last minute
  (batches.callcount) and the adaptive limit here, as fresh as the
  heartbeat (0.5 s);
- `Tally` rows (GET /metrics): running totals of what leaves no row of its
  own: model calls by deployment and answer class, their durations (a
  histogram), flushed outcomes dropped for a lost lease, records resumed at a
  checkpoint. Totals outlive the engines that made them (a counter summed
  over live engines would fall, and read as a reset, each time one stops).

Counting is a dict addition under a lock (nothing on the call path touches
the database); the heartbeat saves the deltas in one upsert a series, keys
sorted so two engines never wait on each other's rows in opposite orders.
A killed engine loses at most its last heartbeat's counts; a clean stop
saves them.

Tally keys are "<name>|<label>|...":
  calls|<deployment>|<class>       class: 2xx, 4xx, 429, 5xx (answers), failed (no answer), time_limit
  call_us|<deployment>|<i>         calls that took at most BUCKETS_S[i] and more than the one before
                                   (i = len(BUCKETS_S): longer); the scrape makes them cumulative
  call_us_sum|<deployment>         their durations, in microseconds
  lease_lost                       outcomes a flush dropped: the record's lease had gone to another engine
  resumed                          records claimed again at their checkpoint (multi-step records)
"""

import bisect
import threading
from collections import Counter, defaultdict

from django.db import connection

from batches.callcount import CallCount, deployment_failed
from batches.figures import Figures
from batches.models import Engine, Tally

# Model calls take 10 ms (a small model, warm) to the 30-minute limit.
BUCKETS_S = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0, 1800.0)

_lock = threading.Lock()
_deltas = Counter()
# Model calls are counted by tuple and named as Tally keys at `take`: formatting three
# key strings a call was a third of the count's cost (6.1 us a call, now 4.5 us).
_calls = Counter()  # (deployment pk, answer class, duration bucket) -> calls
_call_us = Counter()  # deployment pk -> their durations, in microseconds
_minute = defaultdict(CallCount)  # deployment pk -> its calls of the last minute in this process


def answer_class(result):
    if result.kind == "time_limit":
        return "time_limit"
    if result.kind != "response" or result.status_code is None:
        return "failed"
    if result.status_code == 429:
        return "429"
    return f"{result.status_code // 100}xx"


def call(deployment_id, result, seconds):
    """Count one attempt of a model call at a deployment (each retry and failover is one)."""
    if deployment_id is None:
        return
    answer = answer_class(result)
    bucket = bisect.bisect_left(BUCKETS_S, seconds)
    with _lock:
        _calls[deployment_id, answer, bucket] += 1
        _call_us[deployment_id] += int(seconds * 1_000_000)
        _minute[deployment_id].add(not deployment_failed(answer, result.status_code))


def _named_calls():
    """The model calls counted since the last take, as Tally keys (the caller holds _lock)."""
    named = Counter()
    for (pk, answer, bucket), n in _calls.items():
        named[f"calls|{pk}|{answer}"] += n
        named[f"call_us|{pk}|{bucket}"] += n
    for pk, us in _call_us.items():
        named[f"call_us_sum|{pk}"] += us
    _calls.clear()
    _call_us.clear()
    return named


def flushed(outcomes, written, claimed):
    """Count a flush-and-claim trip: outcomes the flush dropped, records claimed at a checkpoint."""
    lost = sum(max(0, len(done) - written.get(pk, 0)) for pk, done in outcomes.items())
    resumed = sum(1 for records in claimed.values() for record, _ in records if record.checkpoint is not None)
    if lost or resumed:
        with _lock:
            _deltas["lease_lost"] += lost
            _deltas["resumed"] += resumed


def take(upstreams=()):
    """(the deltas counted since the last take, this engine's {deployment: flow.Figures}).

    Runs on the engine's loop, so the calls in flight are read where they change."""
    global _deltas
    with _lock:
        deltas, _deltas = _deltas, Counter()
        deltas.update(_named_calls())
        in_flight, limits = Counter(), Counter()
        for upstream in upstreams:  # a replaced deployment's old Upstream may still carry calls
            in_flight[upstream.deployment_id] += upstream.in_use
            limits[upstream.deployment_id] += upstream.share
        # A deployment's last minute outlives its lane: an engine closes a model's lane once its
        # batches are done, and the operator page would read "0 calls a minute" at once.
        recent = {pk: count.last_minute() for pk, count in _minute.items()}
        calls = {
            str(pk): Figures(in_flight.get(pk, 0), *recent.get(pk, (0, 0)), limits[pk] if pk in in_flight else None)
            for pk in in_flight.keys() | {pk for pk, (n, _) in recent.items() if n}
        }
    return deltas, calls


def publish(owner, taken):
    """Save what `take` returned: the engine's calls on its row, the deltas into the totals."""
    deltas, calls = taken
    Engine.objects.filter(owner=owner).update(calls=calls)
    save(deltas)


def save(deltas):
    if not deltas:
        return
    table = connection.ops.quote_name(Tally._meta.db_table)
    # One statement a series, in key order; SQLite and PostgreSQL both speak ON CONFLICT.
    with connection.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO {table} (key, value) VALUES (%s, %s) "
            f"ON CONFLICT (key) DO UPDATE SET value = {table}.value + excluded.value",
            sorted(deltas.items()),
        )
