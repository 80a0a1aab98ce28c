"""Pause and resume across kill -9 of a real worker cluster: a paused batch stays paused after the
restart, a resumed one resumes once and bills every record once."""

import pytest

from batches import guardrails
from batches.models import Engine, Record
from openrelay.simulator.config import SimulatorConfig
from openrelay.simulator.server import run_in_thread
from tests.helpers import assert_exactly_once, chat, make_batch, status_of, succeeded, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _fresh(batch):
    batch.refresh_from_db()
    return batch


def test_a_paused_batch_stays_paused_across_kill_9_and_resumes_once(alice, model, clusters):
    with run_in_thread(SimulatorConfig(latency_ms=20)) as slow:
        model.deployments.update(base_url=slow.base_url, max_concurrency=16)
        batch = make_batch(alice.org, [chat(f"q{i}") for i in range(600)])
        first = clusters()
        wait_for(lambda: succeeded(batch) >= 50, 60, "records to run")
        guardrails.pause_batch(_fresh(batch))
        wait_for(lambda: not Record.objects.filter(batch=batch, status="running").exists(), 15, "calls to settle")
        calls = slow.request_count
        killed = set(Engine.objects.values_list("owner", flat=True))
        first.kill()
        clusters()
        # The new engines are up and polling (they beat twice), and still nothing is claimed.
        new = Engine.objects.exclude(owner__in=killed)
        wait_for(lambda: new.count() >= 2, 60, "the new cluster's engines")
        seen = dict(new.values_list("owner", "seen_at"))
        wait_for(
            lambda: sum(at > seen.get(owner, at) for owner, at in new.values_list("owner", "seen_at")) >= 2,
            30,
            "the new engines to beat again (and poll)",
        )
        assert slow.request_count == calls
        assert not Record.objects.filter(batch=batch, status="running").exists()
        assert _fresh(batch).paused_at is not None and status_of(batch) == "in_progress"
        guardrails.resume_batch(_fresh(batch))
        wait_for(lambda: status_of(batch) == "completed", 90, "the resumed batch to complete")
        assert slow.request_count == 600  # every record sent once: nothing twice across pause and kill
    assert_exactly_once(batch, 600)
