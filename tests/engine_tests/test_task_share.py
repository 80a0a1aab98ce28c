"""How much of a model one worker task uses: its share among live sibling tasks, within OPENRELAY_TASK_CONCURRENCY."""

from aiohttp import web

from batches.engine.runner import run_batch, task_share
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
