"""The adaptive limit's rules, one reaction at a time (batches.engine.calls.flow), and the server figures it reads."""

from batches.engine.calls.flow import BACKOFF, FlowControl, read_metrics


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
    flow = FlowControl(128, start=8, tolerance=2.0)
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
