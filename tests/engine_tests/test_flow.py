"""The adaptive limit's rules, one reaction at a time (batches.engine.calls.flow), and the server figures it reads."""

import pytest

from batches.engine.calls.flow import (
    BACKOFF,
    BASELINE_CALLS,
    BASELINE_MAX_S,
    BURST_S,
    FlowControl,
    peer_limits,
    read_metrics,
)


def answer_window(flow, seconds, now, filled=True):
    """A window of answers (as many as the limit), each with the limit's calls in flight (or one fewer)."""
    for _ in range(max(1, flow.limit)):
        flow.observe(seconds, flow.limit if filled else 0, now)


def test_slow_start_doubles_each_round_trip_until_the_ceiling():
    flow = FlowControl(64, start=4)
    limits = []
    for step in range(6):
        limits.append(flow.limit)
        answer_window(flow, 0.2, now=step)
    assert limits[:4] == [4, 8, 16, 32]
    assert flow.limit == 64  # and no further: max_concurrency is the ceiling


def test_an_unfilled_limit_does_not_grow():
    flow = FlowControl(64, start=4)
    for step in range(5):
        answer_window(flow, 0.2, now=step, filled=False)
    assert flow.limit == 4


def test_an_overload_cuts_the_limit_once_for_the_calls_that_saw_the_old_one():
    flow = FlowControl(64, start=40)
    flow.overloaded(sent_at=1.0, now=2.0)
    assert flow.limit == int(40 * BACKOFF)
    flow.overloaded(sent_at=1.5, now=2.1)  # sent before the cut: the same overload
    assert flow.limit == int(40 * BACKOFF)
    flow.overloaded(sent_at=2.2, now=3.0)  # sent after it: the server is still overloaded
    assert flow.limit == int(40 * BACKOFF * BACKOFF)
    assert not flow.slow_start


def test_after_an_overload_the_limit_grows_by_one_a_window():
    flow = FlowControl(64, start=20)
    flow.overloaded(sent_at=0.0, now=0.0)
    before = flow.limit
    for step in range(3):
        answer_window(flow, 0.2, now=1 + step)
    assert flow.limit == before + 3


def test_calls_taking_longer_than_the_tolerance_over_their_baseline_shrink_the_limit():
    flow = FlowControl(128, start=8, tolerance=2.0, line=0)  # the tolerance alone
    answer_window(flow, 0.2, now=0)  # the baseline: 0.2 s
    while flow.slow_start and flow.limit < 128:
        answer_window(flow, 0.25, now=1)
    grown = flow.limit
    answer_window(flow, 0.8, now=2)  # 4x the baseline: calls queue in the server
    assert flow.limit < grown
    assert not flow.slow_start
    shrunk = flow.limit
    answer_window(flow, 0.3, now=3)  # within the tolerance again: grows back, one a window
    assert flow.limit == shrunk + 1


def test_the_calls_estimated_waiting_in_the_server_are_held_to_the_line():
    """Issue 55: a server whose queue is no longer than its slots refuses before its calls take 2x
    their baseline, so the tolerance never fired. 16 slots, 0.2 s a call: 20 in flight take 0.25 s
    (4 wait: 20 x (1 - 0.2/0.25)), past a line of a quarter of 20 (5)? No; 24 take 0.3 s (8 wait,
    past a line of 6): shrink by the 2 past it; back under the line, grow a call a window."""
    flow = FlowControl(128, start=24, line=0.25)
    flow.overloaded(sent_at=0, now=0)  # out of slow start: the limit is 16
    answer_window(flow, 0.2, now=1)  # the baseline
    flow.value = 24.0
    flow._clamp()
    answer_window(flow, 0.3, now=2)  # 1.5x: under the tolerance, 8 waiting past a line of 6
    assert flow.limit == 22
    answer_window(flow, 0.25, now=3)  # 1.25x: 4.4 of 22 waiting, under a line of 5.5
    assert flow.limit == 23


def test_without_a_line_the_tolerance_alone_steers():
    flow = FlowControl(128, start=24, line=0)
    flow.overloaded(sent_at=0, now=0)
    answer_window(flow, 0.2, now=1)
    before = flow.limit
    answer_window(flow, 0.3, now=2)
    assert flow.limit == before + 1  # 1.5x the baseline, under the tolerance of 2: it grows


def test_a_503_teaches_a_ceiling_that_creeps_to_the_next_refusal_then_holds_then_is_probed_again():
    """The calls in flight when a refused call was sent, less one, hold the limit for `hold_s`
    whatever the answers say, except for a creep: from a random 1-2x BURST_S after the hold began,
    the ceiling grows a call a BURST_S until the next refusal, where it goes back (no backoff) and
    then holds. After a hold without a 503 it grows past the ceiling again, a call a window."""
    flow = FlowControl(64, start=40, hold_s=30)
    flow.overloaded(sent_at=1.0, now=1.0, status=503, sent_with=20)
    assert flow.learned == 19 and flow.news  # a new hold: the other engines hear of it
    assert 1.0 + BURST_S <= flow.creep_from <= 1.0 + 2 * BURST_S
    flow.news = False
    assert flow.limit == 19  # the backoff (28) or the ceiling, whichever is lower
    answer_window(flow, 0.2, now=1.0 + BURST_S - 0.01)  # the burst: held
    assert flow.limit == 19
    flow.overloaded(sent_at=0.9, now=1.3, status=503, sent_with=20)  # one more of the burst
    assert flow.learned == 18 and not flow.news
    began = flow.creep_at
    answer_window(flow, 0.2, now=began)  # the creep: a call
    assert flow.learned == 19 and flow.limit == 19
    answer_window(flow, 0.2, now=began + BURST_S / 2)  # at most a call a BURST_S
    assert flow.learned == 19
    answer_window(flow, 0.2, now=began + BURST_S)
    assert flow.learned == 20 and flow.limit == 20
    flow.overloaded(sent_at=began + 4.5, now=began + 4.5, status=503, sent_with=20)  # the creep met the edge
    assert flow.learned == 19 and flow.limit == 19 and flow.news  # no backoff; the others hear of it
    for step in range(20):  # fast, full windows for the rest of the hold: no growth past 19
        answer_window(flow, 0.2, now=began + 5 + step)
    assert flow.limit == 19
    answer_window(flow, 0.2, now=began + 35)  # the hold (30 s from the last 503) is over: one more a window again
    assert flow.learned is None and flow.limit == 20
    answer_window(flow, 0.2, now=began + 35.5)
    assert flow.limit == 21


def test_a_refusal_heard_past_the_burst_stops_the_creep_begun_or_not():
    flow = FlowControl(64, start=16, hold_s=30)
    flow.overloaded(sent_at=1.0, now=1.0, status=503, sent_with=10)
    flow.peer_refused(9, now=1.5)  # another engine's refusal of the same burst: the creep still comes
    began = flow.creep_at
    answer_window(flow, 0.2, now=began)
    assert flow.learned == 10
    flow.peer_refused(10, now=began + 0.5)  # another engine's creep found the edge
    for step in range(10):
        answer_window(flow, 0.2, now=began + 1 + step)
    assert flow.learned == 10 and flow.limit == 10
    # An engine whose creep had not begun yet does not step into the full server either.
    other = FlowControl(64, start=16, hold_s=30)
    other.peer_refused(6, now=1.0)
    other.peer_refused(6, now=1.0 + BURST_S)  # before its creep (1-2x BURST_S in), past the burst
    for step in range(10):
        answer_window(other, 0.2, now=2 + BURST_S + step)
    assert other.learned == 6


def test_every_503_of_a_burst_counts_the_lowest_is_the_ceiling():
    flow = FlowControl(64, start=16, hold_s=30)
    flow.overloaded(sent_at=1.0, now=1.0, status=503, sent_with=18)
    flow.overloaded(sent_at=0.9, now=1.01, status=503, sent_with=17)  # sent before the cut: no second cut
    assert flow.learned == 16
    flow.overloaded(sent_at=5.0, now=5.0, status=429, sent_with=3)  # a rate limit teaches no ceiling
    assert flow.learned == 16
    flow.overloaded(sent_at=40.0, now=40.0, status=503, sent_with=12)  # a later hold starts afresh
    assert flow.learned == 11


def test_the_refusals_of_one_burst_are_not_counted_as_held():
    """Issue 55: slow start's last doubling sent four calls at once with 8 in flight, and the server
    refused all four: it held 4, not the 7 each refusal alone says (4 engines summed 28 on 16 slots
    and sawed into 503s until their ceilings came down: 36 refusals where one engine drew 15)."""
    flow = FlowControl(256, start=8, hold_s=30)
    for sent_at in (1.0, 1.001, 1.002, 1.003):
        flow.overloaded(sent_at=sent_at, now=1.04, status=503, sent_with=8)
    assert flow.learned == 4 and flow.limit == 4
    # A refusal once the burst is over counts only itself.
    flow.overloaded(sent_at=2.0, now=2.01, status=503, sent_with=4)
    assert flow.learned == 3


def test_without_a_hold_a_503_only_backs_off():
    flow = FlowControl(64, start=20, hold_s=0)
    flow.overloaded(sent_at=1.0, now=1.0, status=503, sent_with=20)
    assert flow.learned is None and flow.limit == int(20 * BACKOFF)


def test_a_held_engine_does_not_level_and_its_ceiling_follows_its_part():
    flow = FlowControl(32, start=16, hold_s=30)
    flow.overloaded(sent_at=1.0, now=1.0, status=503, sent_with=9)
    assert flow.limit == 8
    answer_window(flow, 0.2, now=2)
    assert flow.limit == 8
    flow.level_with(2)  # another engine's limit: the held one stays where the server put it
    assert flow.limit == 8
    flow.set_ceiling(64)  # the other engine left: this one's part of the server doubles
    assert flow.learned == 16
    flow.absorb(4, in_flight=8)  # a dead engine's 4 calls, which the server held too
    assert flow.learned == 20 and flow.limit == 12


def test_an_engine_with_no_part_yet_is_no_limit_to_level_with():
    """Row 18: an engine publishes a limit of 0 until its part of max_concurrency is set, and the
    others levelled down to it at every start (5 and 10 calls in flight, limits of 2.5 and 5.8)."""
    live = [("a", {}, {"7": [10, 0, 0, 10]}), ("b", {}, {"7": [0, 0, 0, 0]}), ("c", {}, {"7": [4, 0, 0, 6]})]
    assert dict(peer_limits(live, "a")) == {7: [6]}
    assert dict(peer_limits(live[:2], "a")) == {}


def test_a_refusal_heard_holds_the_calls_out_even_past_a_limit_just_levelled_down():
    flow = FlowControl(64, start=16, hold_s=30)
    flow.level_with(4)  # 16 -> 10, with 16 calls still out
    assert flow.limit == 10
    flow.peer_refused(16, now=1.0)
    assert flow.learned == 16 and flow.limit == 10  # the server holds 16 of its calls
    answer_window(flow, 0.2, now=1.5)
    assert flow.limit == 11  # grows back to them, a call a window


def test_a_fast_servers_jitter_is_not_a_queue():
    flow = FlowControl(64, start=8)
    answer_window(flow, 0.001, now=0)
    for step in range(4):
        answer_window(flow, 0.004, now=1 + step)  # 4x, but 3 ms: scheduling noise
    assert flow.limit == 64


def test_the_servers_waiting_line_steers_the_limit_when_it_publishes_one():
    flow = FlowControl(128, start=40)
    flow.overloaded(sent_at=0, now=0)  # out of slow start
    flow.metrics(waiting=20, running=16, kv_usage=0.5, now=1.0)
    before = flow.limit
    answer_window(flow, 0.2, now=1.5)
    assert flow.limit < before  # 20 waiting, 2 wanted: shrink
    flow.metrics(waiting=0, running=16, kv_usage=0.5, now=2.0)
    before = flow.limit
    answer_window(flow, 0.2, now=2.5)
    assert flow.limit > before  # nothing waiting: the slots may idle, grow
    flow.metrics(waiting=0, running=16, kv_usage=0.99, now=3.0)
    before = flow.limit
    answer_window(flow, 0.2, now=3.5)
    assert flow.limit == before  # the KV cache is full: no room for more, whatever the line says


def test_stale_server_figures_give_way_to_latency():
    flow = FlowControl(128, start=20)
    flow.overloaded(sent_at=0, now=0)
    flow.metrics(waiting=50, running=16, kv_usage=None, now=1.0)
    before = flow.limit
    answer_window(flow, 0.2, now=10.0)  # the figures are 9 s old
    assert flow.limit == before + 1


def test_the_ceiling_moves_without_losing_the_learned_level():
    flow = FlowControl(64, start=24)
    flow.set_ceiling(0)  # not yet published: no calls at all
    assert flow.limit == 0
    flow.set_ceiling(64)
    assert flow.limit == 24
    flow.set_ceiling(10)
    assert flow.limit == 10


def test_off_the_limit_is_the_ceiling_whatever_the_answers():
    flow = FlowControl(64, start=4, adaptive=False)
    assert flow.limit == 64
    flow.overloaded(sent_at=1, now=1)
    answer_window(flow, 5.0, now=2)
    assert flow.limit == 64
    flow.set_ceiling(32)
    assert flow.limit == 32


def queueing_server_limits(start, slots=4, call_s=0.3, minutes=10):
    """The limit, window after window, against a server that queues without end past its `slots` (llama.cpp
    defers what its slots can't take): a window of L calls in flight takes max(call_s, L x call_s / slots)
    (Little's law: the slots finish slots / call_s calls a second)."""
    flow, now, limits = FlowControl(256, start=start), 0.0, []
    while now < minutes * 60:
        calls = flow.limit
        seconds = max(call_s, calls * call_s / slots)
        for _ in range(max(1, calls)):
            flow.observe(seconds, calls, now)
        now += seconds
        limits.append(calls)
    return limits


def test_long_calls_probe_less_often_and_still_hold_the_line():
    """A drain probe costs about a call time at half the limit: with 10 s calls, one a minute was ~8% of the
    calls. The baseline of long calls lives BASELINE_CALLS call times (up to BASELINE_MAX_S), so an hour holds
    ~12 probes, not 60; and a start above the slots, whose first baseline is queued, still comes down to the line."""
    probes = []

    class Counted(FlowControl):
        def _start_probe(self, now):
            probes.append(now)
            super()._start_probe(now)

    flow, now, limits = Counted(256, start=16), 0.0, []
    while now < 3600:
        calls = flow.limit
        seconds = max(10.0, calls * 10.0 / 4)
        for _ in range(max(1, calls)):
            flow.observe(seconds, calls, now)
        now += seconds
        limits.append(calls)
    assert max(limits[-20:]) <= 7, limits[-20:]
    assert 2 <= len(probes) <= 3600 / min(BASELINE_CALLS * 10, BASELINE_MAX_S) + 1, probes


@pytest.mark.parametrize("start", [2, 16])
def test_the_line_holds_against_a_server_that_queues_without_end(start):
    limits = queueing_server_limits(start)
    # 4 slots and a line of a quarter of the calls in flight: 5-6 in flight, 7 with the growth of a window.
    assert max(limits[-50:]) <= 7, limits[-50:]


def held_at_the_line(now=0.0):
    """A limit of 8 out of slow start whose baseline (0.2 s) was measured at `now`."""
    flow = FlowControl(128, start=8)
    flow.overloaded(sent_at=now, now=now)
    answer_window(flow, 0.2, now=now)
    flow.value = 8.0
    flow._clamp()
    return flow


def test_a_drain_probe_halves_the_limit_for_one_window_before_the_baseline_ages_out():
    """Issue 55: with every window queued, the lowest mean aged out each minute and the baseline rose
    to a queued mean. Before it ages out, one window runs at half the limit; its mean is the new
    baseline, and the limit before it comes back."""
    flow = held_at_the_line()
    answer_window(flow, 0.28, now=30, filled=False)  # queued (1.4x): the baseline is not yet due
    assert flow.limit == 8 and flow.probe is None
    answer_window(flow, 0.28, now=59.5, filled=False)  # the baseline (0 s) ages out within two windows
    assert flow.limit == 4 and flow.probe is not None
    for _ in range(8):  # answers of calls sent before the probe: they queued, and don't count
        flow.observe(0.28, 8, 59.7)
    assert flow.probe is not None
    answer_window(flow, 0.25, now=60)  # the probe's window, sent at 59.75: a fresh baseline
    assert flow.probe is None and flow.limit == 8
    assert list(flow.means) == [(0, 0.2), (60, 0.25)]  # the next baseline: not the queued 0.28 s


def test_no_drain_probe_while_a_window_near_the_baseline_keeps_it_fresh():
    flow = held_at_the_line()
    answer_window(flow, 0.22, now=30, filled=False)  # 20 ms over the baseline: no queue, a candidate
    answer_window(flow, 0.28, now=59.5, filled=False)
    assert flow.probe is None and flow.limit == 8
    answer_window(flow, 0.28, now=61, filled=False)  # the baseline is 0.22 s now (from 30 s): still fresh
    assert flow.probe is None and flow.limit == 8


def test_an_overload_during_a_drain_probe_is_not_undone_by_it():
    flow = held_at_the_line()
    answer_window(flow, 0.28, now=59.5, filled=False)
    assert flow.limit == 4
    flow.overloaded(sent_at=59.6, now=59.8)
    answer_window(flow, 0.25, now=60, filled=False)
    assert flow.probe is None and flow.limit == int(4 * BACKOFF)


def test_the_floor_holds():
    flow = FlowControl(64, start=4, floor=3)
    for step in range(10):
        flow.overloaded(sent_at=step, now=step)
    assert flow.limit == 3


VLLM = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 16.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 7.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.42
"""

LLAMACPP = """# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 4
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 2
"""


def test_server_figures_are_read_from_vllm_and_llamacpp_pages():
    assert read_metrics(VLLM) == (7.0, 16.0, 0.42)
    assert read_metrics(LLAMACPP) == (2.0, 4.0, None)
    assert read_metrics("# nothing here\nprocess_cpu_seconds_total 3\n") is None
    assert read_metrics("not { prometheus") is None


def test_another_engines_refusal_holds_the_calls_in_flight_as_a_ceiling():
    flow = FlowControl(256, start=8, hold_s=30)
    flow.peer_refused(in_flight=6, now=1.0)
    assert not flow.slow_start and flow.limit == 6 and flow.learned == 6
    assert 31.0 <= flow.held_until <= 46.0  # longer than the refused engine's own hold: one probes at a time
    answer_window(flow, 0.2, now=2)
    assert flow.limit == 6  # held, as if refused itself
    answer_window(flow, 0.2, now=flow.held_until + 1)
    assert flow.limit == 7  # then a call a window


def test_another_engines_refusal_holds_a_held_ceiling_longer():
    flow = FlowControl(256, start=8, hold_s=30)
    flow.overloaded(sent_at=1.0, now=1.0, status=503, sent_with=9)
    flow.peer_refused(in_flight=3, now=20.0)
    assert flow.limit == 8 and flow.learned == 8  # its own refusal told it where it stands
    assert flow.held_until >= 50.0


def test_without_a_hold_another_engines_refusal_only_stops_growth():
    flow = FlowControl(256, start=8, hold_s=0)
    flow.peer_refused(in_flight=6, now=1.0)
    assert not flow.slow_start and flow.limit == 6 and flow.learned is None


def test_a_deployment_opened_just_after_another_engine_was_refused_there_joins_held():
    """Row 18: an engine that opened its lane 0.3 s after the others' burst of refusals sent its
    start into the full server (its refusal and three of another engine's, whose slots it took)."""
    import asyncio
    import time

    from batches.engine.calls.caller import ModelCaller
    from batches.engine.config import EngineConfig
    from batches.engine.fairness import CallGate, OrgCaps
    from batches.engine.lanes import Lane
    from batches.engine.peers import REFUSAL_NEWS_S, Peers

    def row(pk):
        return {
            "pk": pk,
            "base_url": "http://127.0.0.1:9/v1",
            "upstream_model": "m",
            "model__name": "m",
            "api_key": "",
            "messages_api": "translate",
            "max_concurrency": 64,
            "health": "healthy",
            "health_changed_at": None,
            "last_error": "",
            "needs_canary": False,
        }

    async def go():
        config = EngineConfig.read()
        peers = Peers(config, "me", None, OrgCaps(), None, lambda: None, lambda: True)
        peers.heard = {1: time.time() - 1.0, 2: time.time() - REFUSAL_NEWS_S - 1.0}  # 2: old news
        async with ModelCaller([], time_limit_s=30, retries=1, gate=CallGate(OrgCaps())) as caller:
            lane = Lane(7, caller, config)
            peers._reconcile(lane, [row(1), row(2), row(3)])
            told, old, quiet = (lane.upstreams[pk].flow for pk in (1, 2, 3))
            assert told.learned == 1 and not told.slow_start  # held at the calls it has out: none, the floor
            assert old.learned is None and old.slow_start
            assert quiet.learned is None and quiet.slow_start

    asyncio.run(go())
