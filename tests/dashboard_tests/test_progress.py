"""Stored progress samples (batches.progress): bounded, dense at the end, read for the rate and ETA."""

from batches import progress


def test_it_appends_at_most_every_sample_interval():
    samples = progress.appended([], 1000.0, 0, 0)
    assert samples == [[1000.0, 0, 0]]
    assert progress.appended(samples, 1001.0, 5, 0) is None
    assert progress.appended(samples, 1002.0, 5, 1) == [[1000.0, 0, 0], [1002.0, 5, 1]]


def test_a_flat_stretch_keeps_one_point_at_each_end():
    samples = [[1000.0, 5, 0], [1002.0, 5, 0]]
    assert progress.appended(samples, 1004.0, 5, 0) == [[1000.0, 5, 0], [1004.0, 5, 0]]


def test_it_stays_bounded_and_keeps_the_last_minute_whole():
    samples = []
    for i in range(5000):  # 10,000 s of samples every 2 s
        samples = progress.appended(samples, 1000.0 + 2 * i, i, 0)
    assert len(samples) <= progress.MAX_SAMPLES
    assert samples[0] == [1000.0, 0, 0]  # the start stays
    recent = samples[-progress.RECENT_SAMPLES :]
    assert [b[0] - a[0] for a, b in zip(recent, recent[1:])] == [2.0] * (progress.RECENT_SAMPLES - 1)
    assert len(str(samples)) < 4000  # the stored JSON's order of size


def test_the_rate_is_read_over_the_last_minute_up_to_now():
    samples = [[0.0, 0, 0], [100.0, 100, 0], [160.0, 400, 20]]
    assert progress.rate(samples, 160.0, 420) == 320 / 60  # 100 -> 420 records between t=100 and t=160
    # Nothing more finished for a minute: the rate falls though no sample says so.
    assert progress.rate(samples, 220.0, 420) == 0.0
    assert progress.rate([], 10.0, 0) is None


def test_eta_and_not_run():
    assert progress.eta_s(5.0, 100) == 20.0
    assert progress.eta_s(0.0, 100) is None and progress.eta_s(None, 0) == 0.0
    assert progress.not_run("cancelled", 900, [[1.0, 100, 0], [5.0, 100, 20]]) == 880
    assert progress.not_run("completed", 20, [[5.0, 100, 20]]) == 0


def test_the_final_sample_ends_the_series_at_the_finish():
    samples = [[1000.0, 0, 0], [1002.0, 5, 0], [1004.6, 9, 0]]
    assert progress.final(samples, 1004, 10, 0) == [[1000.0, 0, 0], [1002.0, 5, 0], [1004, 10, 0]]
    assert progress.series(990, samples)[0] == [990, 0, 0]


def test_a_deployments_calls_are_counted_over_the_last_minute():
    from batches.callcount import CallCount

    now = [1000.0]
    count = CallCount(clock=lambda: now[0])
    for i in range(120):  # two calls a second for a minute, every tenth failed
        now[0] = 1000.0 + i / 2
        count.add(ok=i % 10 != 0)
    assert count.last_minute() == (120, 12)
    now[0] = 1090.0  # 30 s later, half the minute has gone by
    assert count.last_minute() == (58, 5)  # seconds 1031-1059
    now[0] = 1200.0
    assert count.last_minute() == (0, 0)


def test_records_done_in_the_last_minute_are_read_from_the_samples():
    samples = [[0.0, 0, 0], [100.0, 100, 0], [160.0, 400, 20]]
    assert progress.done_since(samples, 100.0, 450) == 350
    assert progress.done_since(samples, -60.0, 30) == 30  # began within the minute: everything so far
    assert progress.done_since([], 0.0, 5) == 0


def test_an_engine_reports_a_deployments_last_minute_after_its_lane_closed():
    from batches import tallies
    from batches.engine.calls.caller import CallResult
    from batches.figures import Figures

    class Upstream:
        deployment_id, in_use, share = 991, 2, 6

    tallies.take()  # whatever earlier tests counted
    for status in (200, 200, 500):
        tallies.call(991, CallResult(kind="response", status_code=status), 0.01)
    assert tallies.take([Upstream()])[1]["991"] == Figures(in_flight=2, calls=3, failed=1, limit=6)
    assert tallies.take([])[1]["991"] == Figures(0, 3, 1, None)  # no Upstream any more: still the last minute's calls
