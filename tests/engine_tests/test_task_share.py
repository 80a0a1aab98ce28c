"""How much of a model one worker task uses: its share among the live tasks calling the model,
within OPENRELAY_TASK_CONCURRENCY."""

import time
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web
from django.db import connections

from batches.engine.runner import run_batch, task_share
from batches.models import Batch
from openrelay.simulator import SimulatorConfig, run_in_thread
from tests.engine_tests.conftest import chat, make_batch


def test_task_share():
    assert task_share(64, 2) == 32
    assert task_share(64, 1) == 64
    assert task_share(64, 1, cap=16) == 16
    assert task_share(64, 8, cap=16) == 8
    assert task_share(3, 8) == 1  # never zero


def _peak_tracking_simulator(latency_ms):
    sim = run_in_thread(SimulatorConfig(latency_ms=latency_ms, record=False))
    sim.now = sim.peak = 0

    @web.middleware
    async def track(request, handler):
        sim.now += 1
        sim.peak = max(sim.peak, sim.now)
        try:
            return await handler(request)
        finally:
            sim.now -= 1

    sim.app.middlewares.append(track)
    return sim


def test_a_lone_task_grows_to_the_whole_deployment_and_the_task_cap_bounds_it(alice, model, settings):
    settings.OPENRELAY_TASKS_PER_BATCH = 2
    with _peak_tracking_simulator(200) as sim:
        model.deployments.update(base_url=sim.base_url, max_concurrency=16)
        # Alone on the batch, the task starts at 16 // 2 and grows to 16 once it
        # has counted its (zero) live siblings.
        run_batch(make_batch(alice.org, [chat(f"a{i}") for i in range(64)]).pk)
        assert sim.peak == 16
        sim.peak = 0
        settings.OPENRELAY_TASK_CONCURRENCY = 4
        run_batch(make_batch(alice.org, [chat(f"b{i}") for i in range(24)]).pk)
        assert sim.peak == 4


def test_two_batches_on_one_model_share_its_concurrency(alice, model, settings):
    """Each batch's task gets half the model, not all of it: together they stay within max_concurrency."""
    settings.OPENRELAY_TASKS_PER_BATCH = 1
    with _peak_tracking_simulator(100) as sim:
        model.deployments.update(base_url=sim.base_url, max_concurrency=16)
        first = make_batch(alice.org, [chat(f"a{i}") for i in range(400)])
        second = make_batch(alice.org, [chat(f"b{i}") for i in range(200)])
        # The second task counts the first and starts at half; the first
        # re-counts within STATUS_CHECK_EVERY_S and shrinks as its calls
        # end: settled well before the second has done 8 rounds of 8 calls.
        alone_peak, shared_peak = _peaks_of_two(sim, first, second, first_done=16, settled=64, until=160)
    assert alone_peak == 16  # alone on the model, the first batch's task took all of it
    assert shared_peak == 16
    assert {Batch.objects.get(pk=pk).status for pk in (first.pk, second.pk)} == {"completed"}


def test_an_organization_cap_bounds_all_its_batches_together(alice, model, settings):
    settings.OPENRELAY_TASKS_PER_BATCH = 1
    alice.org.max_concurrency = 6
    alice.org.save(update_fields=["max_concurrency"])
    with _peak_tracking_simulator(100) as sim:
        model.deployments.update(base_url=sim.base_url, max_concurrency=64)
        # Alone, a batch of the capped organization takes its cap, not the model's 64.
        run_batch(make_batch(alice.org, [chat(f"solo{i}") for i in range(30)]).pk)
        assert sim.peak == 6
        sim.peak = 0
        first = make_batch(alice.org, [chat(f"a{i}") for i in range(200)])
        second = make_batch(alice.org, [chat(f"b{i}") for i in range(90)])
        # Settled well before the second has done 8 rounds of its 3 calls.
        _, shared_peak = _peaks_of_two(sim, first, second, first_done=6, settled=24, until=75)
    assert shared_peak == 6  # 3 + 3, the model had room for 64


def _peaks_of_two(sim, first, second, *, first_done, settled, until):
    """Run `first`, then `second` beside it; return the model's peak calls with `first` alone
    (once it has done `first_done` records) and with both running (from when `second` has done
    `settled` records to when it has done `until`)."""
    def done(batch):
        return Batch.objects.get(pk=batch.pk).completed_count

    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(_in_thread, first.pk)
        _wait_for(lambda: done(first) >= first_done)
        alone_peak = sim.peak
        joined = pool.submit(_in_thread, second.pk)
        _wait_for(lambda: done(second) >= settled)
        sim.peak = 0
        _wait_for(lambda: done(second) >= until)
        shared_peak = sim.peak
        running.result(timeout=60), joined.result(timeout=60)
    return alone_peak, shared_peak


def _in_thread(batch_pk):
    try:
        return run_batch(batch_pk)
    finally:
        connections.close_all()


def _wait_for(condition, timeout_s=30):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
