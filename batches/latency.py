"""Published latency: a batch's time to its first result and to its completion, and their histograms.

- time_to_first_result: seconds from created_at to first_result_at, when the first of its records
  ended, succeeded or failed (the finish time of the first flush that wrote any of its outcomes,
  or its create when the answer cache answered lines at once). Records an expiry or a cancel
  closed unrun are not results: a batch none of whose records ran has none (null).
- time_to_complete: seconds from created_at to completed_at; null unless the batch completed.

Both are read from the batch row (no record is read). GET /metrics shows them per completion
window as histograms, each batch observed once, in the transaction that completes it
(batches.lifecycle), as Tally rows (batches.tallies: any web process answers a scrape with the
same figures, and they outlive the batches they count):
  first_result_ms|<window>|<i>     completed batches whose first result came within BUCKETS_S[i]
                                   (and after the bucket before; i = len(BUCKETS_S): later)
  first_result_ms_sum|<window>     their times, in milliseconds
  complete_ms|<window>|<i>, complete_ms_sum|<window>   the same for their time to complete
"""

import bisect

from prometheus_client.core import HistogramMetricFamily

from batches.models import Batch, BatchStatus

# From a 60 s test window to a 72 h one.
BUCKETS_S = (1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 14400.0, 43200.0, 86400.0, 259200.0)

FIGURES = (
    ("first_result_ms", "openrelay_batch_time_to_first_result_seconds", "its first record ended"),
    ("complete_ms", "openrelay_batch_time_to_complete_seconds", "it completed"),
)


def _since_created(batch, at):
    return None if at is None else round((at - batch.created_at).total_seconds(), 3)


def time_to_first_result(batch):
    return _since_created(batch, batch.first_result_at)


def time_to_complete(batch):
    return _since_created(batch, batch.completed_at if batch.status == BatchStatus.COMPLETED else None)


def observed(batch, completed_at):
    """The Tally deltas of a batch completing at `completed_at` (its first_result_at read again: the
    instance may predate the flush that set it)."""
    first_result_at = Batch.objects.filter(pk=batch.pk).values_list("first_result_at", flat=True).get()
    figures = (_since_created(batch, first_result_at), _since_created(batch, completed_at))
    deltas = {}
    for (tally, _, _), seconds in zip(FIGURES, figures, strict=True):
        if seconds is None:
            continue
        window = batch.completion_window
        bucket = bisect.bisect_left(BUCKETS_S, seconds)
        deltas[f"{tally}|{window}|{bucket}"] = 1
        deltas[f"{tally}_sum|{window}"] = int(seconds * 1000)
    return deltas


def families(tally_rows):
    """The two histograms, labelled by window, from the Tally rows [(key, value)] of this module."""
    counts = {tally: {} for tally, _, _ in FIGURES}
    sums = {tally: {} for tally, _, _ in FIGURES}
    for key, value in tally_rows:
        name, window, *bucket = key.split("|")
        if name in counts and bucket:
            counts[name].setdefault(window, [0] * (len(BUCKETS_S) + 1))[int(bucket[0])] += value
        elif name.endswith("_sum") and name[: -len("_sum")] in sums:
            sums[name[: -len("_sum")]][window] = value
    for tally, metric, what in FIGURES:
        family = HistogramMetricFamily(
            metric, f"Completed batches' seconds from create until {what}, by completion window.", labels=["window"]
        )
        for window, buckets in sorted(counts[tally].items()):
            family.add_metric([window], _cumulative(buckets), sums[tally].get(window, 0) / 1000)
        yield family


def _cumulative(buckets):
    total, cumulative = 0, []
    for bound, n in zip([*map(str, BUCKETS_S), "+Inf"], buckets, strict=True):
        total += n
        cumulative.append((bound, total))
    return cumulative
