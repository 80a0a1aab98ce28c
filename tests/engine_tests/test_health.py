"""Deployment health and clean stops, with the engine in this process: a model server that goes
away is a pause, a wrong upstream key holds records until it is fixed, a stop hands records back."""

import time

from batches.models import Record
from openrelay.core.models import Deployment
from openrelay.simulator.config import SimulatorConfig
from openrelay.simulator.server import run_in_thread
from tests.engine_tests.test_shares import Engines
from tests.helpers import assert_exactly_once, chat, make_batch, status_of, succeeded, wait_for


def test_the_only_model_server_away_for_seconds_is_a_pause_not_failed_records(alice, model, settings):
    settings.OPENRELAY_PROBE_MAX_S = 0.5
    server = run_in_thread(SimulatorConfig(latency_ms=30, record=False)).start()
    port = server.port
    try:
        model.deployments.update(base_url=server.base_url, max_concurrency=16)
        batch = make_batch(alice.org, [chat(f"q{i}") for i in range(400)])
        with Engines(1):
            wait_for(lambda: succeeded(batch) >= 50, 20, "progress")
            server.stop()
            wait_for(lambda: Deployment.objects.filter(health="unhealthy").exists(), 10, "the deployment to leave")
            deployment = Deployment.objects.get()
            assert deployment.health_changed_at is not None and deployment.last_error
            time.sleep(0.5)  # a deliberate sleep: records that finished before the stop are flushed
            stalled = succeeded(batch)
            time.sleep(2.5)  # a deliberate sleep: the outage is the scenario; nothing may fail meanwhile
            assert succeeded(batch) == stalled
            assert not Record.objects.filter(batch=batch, status="failed").exists()
            server = run_in_thread(SimulatorConfig(latency_ms=30, record=False), port=port).start()
            wait_for(lambda: status_of(batch) == "completed", 30, "the batch to complete")
    finally:
        server.stop()
    out, err = assert_exactly_once(batch, 400)
    assert not err
    assert Deployment.objects.get().health == "healthy"


def test_a_wrong_upstream_key_holds_the_records_until_the_operator_fixes_it(alice, model, settings):
    settings.OPENRELAY_PROBE_MAX_S = 0.5
    with run_in_thread(SimulatorConfig(api_key="right-key")) as guarded:
        model.deployments.update(base_url=guarded.base_url, api_key="wrong-key", max_concurrency=8)
        batch = make_batch(alice.org, [chat(f"q{i}") for i in range(40)])
        with Engines(1):
            wait_for(lambda: Deployment.objects.filter(health="unhealthy").exists(), 10, "the deployment to leave")
            deployment = Deployment.objects.get()
            assert deployment.last_error.startswith("HTTP 401") and "wrong-key" not in deployment.last_error
            time.sleep(1)  # a deliberate sleep: probes keep failing; the records wait
            assert not Record.objects.filter(batch=batch, status__in=("failed", "succeeded")).exists()
            model.deployments.update(api_key="right-key")
            wait_for(lambda: status_of(batch) == "completed", 30, "the batch to complete")
    out, err = assert_exactly_once(batch, 40)
    assert not err


def test_a_stopping_engine_hands_back_what_it_has_not_finished_and_fails_nothing(alice, model, settings):
    settings.OPENRELAY_STOP_GRACE_S = 0.5
    # Calls far longer than the grace period: none may finish while the engine stops.
    with run_in_thread(SimulatorConfig(latency_ms=30000, record=False)) as slow:
        model.deployments.update(base_url=slow.base_url, max_concurrency=16)
        batch = make_batch(alice.org, [chat(f"q{i}") for i in range(100)])
        engines = Engines(1).__enter__()
        wait_for(lambda: Record.objects.filter(batch=batch, status="running").count() >= 8, 10, "calls in flight")
        started = time.monotonic()
        engines.__exit__(None, None, None)  # request_stop, as SIGTERM does in a worker
        assert time.monotonic() - started < 5  # the grace period, not the 30 s calls
    assert not Record.objects.filter(batch=batch).exclude(status="pending").exists()
    assert status_of(batch) == "in_progress"
    # Handed back, not left leased: another engine starts on them at once.
    assert not Record.objects.filter(batch=batch, lease_owner__gt="").exists()
