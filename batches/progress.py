"""A batch's stored progress: samples of its counts over time, and the rate and ETA read from them.

`Batch.progress` is a JSON list of `[t, completed, failed]` samples (t in
unix seconds, one decimal), oldest first. Engines append one at most every
SAMPLE_EVERY_S while they write a batch's records (batches.engine.samples)
and the close appends the last one at the finish time (batches.engine.finish),
so a page loaded at any time draws the true curve, ending where the batch
ended. `failed` counts the records that ran and failed: records a cancel or
an expiry closed unrun are not in any sample.

Bounded: past MAX_SAMPLES, every other sample older than the most recent
RECENT_SAMPLES is dropped (the first one is kept), so the last minute stays
at full resolution (the rate reads it) while the whole run stays on the
chart at coarser and coarser steps. ~25 bytes a sample: at most ~3 KB a batch.

The same rules run in the browser (static/dashboard/dashboard.js `Pace`).
"""

SAMPLE_EVERY_S = 2.0
MAX_SAMPLES = 120
RECENT_SAMPLES = 30  # 60 s at SAMPLE_EVERY_S: the rate's window stays whole
RATE_WINDOW_S = 60.0


def appended(samples, t, completed, failed):
    """`samples` with a sample at `t`, or None when the last one is too recent to add another.

    A sample that says nothing new (same counts as the last one) still moves
    time forward; two in a row with the same counts collapse into the later one.
    """
    samples = list(samples or [])
    t = round(t, 1)
    if samples and t - samples[-1][0] < SAMPLE_EVERY_S:
        return None
    sample = [t, completed, failed]
    if len(samples) >= 2 and samples[-1][1:] == samples[-2][1:] == sample[1:]:
        samples[-1] = sample
    else:
        samples.append(sample)
    return thinned(samples)


def final(samples, t, completed, failed):
    """`samples` ending with the batch's finish: a sample at `t` whatever the spacing."""
    samples = [s for s in (samples or []) if s[0] < t]
    return thinned([*samples, [round(t, 1), completed, failed]])


def thinned(samples):
    if len(samples) <= MAX_SAMPLES:
        return samples
    old, recent = samples[:-RECENT_SAMPLES], samples[-RECENT_SAMPLES:]
    return [old[0], *old[1::2], *recent]


def rate(samples, now, done):
    """Records finished a second over the last RATE_WINDOW_S, up to `now` when `done` were.

    Read against `now`, not the last sample: a stalled batch's rate falls to
    0 as time passes, though no sample says so. None before any sample.
    """
    if not samples:
        return None
    since = now - RATE_WINDOW_S
    start = samples[0]
    for sample in samples:
        if sample[0] > since:
            break
        start = sample  # the last sample at or before the window's start
    elapsed = now - start[0]
    if elapsed <= 0:
        return None
    return max(0.0, (done - start[1] - start[2]) / elapsed)


def done_since(samples, since, done):
    """Records finished after `since`, `done` being finished now: read from the last sample at or
    before it (the first one, when the run began later)."""
    if not samples:
        return 0
    start = samples[0]
    for sample in samples:
        if sample[0] > since:
            break
        start = sample
    return max(0, done - start[1] - start[2])


def eta_s(records_a_second, left):
    """Seconds until the `left` records are done at this rate; None when it can't be told."""
    if left <= 0:
        return 0.0
    if not records_a_second:
        return None
    return left / records_a_second


def series(in_progress_at, samples):
    """The samples to draw, starting from nothing at `in_progress_at` (unix seconds) when it is known."""
    samples = list(samples or [])
    if in_progress_at is None or (samples and samples[0][0] <= in_progress_at):
        return samples
    return [[in_progress_at, 0, 0], *samples]


def not_run(status, failed_count, samples):
    """Records a cancel or an expiry closed before they ran: counted failed by the API (OpenAI's
    shape), told apart by the last sample, which the close takes without them."""
    if status not in ("cancelled", "expired") or not samples:
        return 0
    return max(0, failed_count - samples[-1][2])
