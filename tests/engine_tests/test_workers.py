"""Real django-q2 clusters (separate processes) working batches, including kill -9."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.db import connection

from batches.engine.sweeper import sweep
from batches.models import Batch, Record
from batches.tasks import enqueue_batch
from openrelay.simulator import SimulatorConfig, run_in_thread
from tests.engine_tests.conftest import chat, make_batch, read_lines

ROOT = Path(__file__).resolve().parents[2]
LEASE_S = 2


def _database_url():
    s = connection.settings_dict
    if s["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{s['NAME']}"
    return f"postgres://{s['USER']}@{s['HOST']}:{s['PORT']}/{s['NAME']}"


class Cluster:
    def __init__(self, data_dir):
        env = {**os.environ, "DATABASE_URL": _database_url(), "OPENRELAY_DATA_DIR": str(data_dir),
               "OPENRELAY_LEASE_S": str(LEASE_S), "OPENRELAY_Q_WORKERS": "2", "OPENRELAY_TASKS_PER_BATCH": "2",
               "OPENRELAY_ALLOW_PRIVATE_URLS": "true"}
        self.process = subprocess.Popen([sys.executable, "manage.py", "qcluster"], cwd=ROOT, env=env,
                                        start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def kill(self):
        """kill -9 of the cluster and every worker it forked."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self):
        # Graceful qcluster shutdown takes seconds; the database is the ledger,
        # so tests simply kill it.
        if self.process.poll() is None:
            self.kill()


@pytest.fixture
def clusters(tmp_path, settings):
    settings.STORAGES = {**settings.STORAGES, "default": {
        "BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "files")}}}
    settings.OPENRELAY_LEASE_S = LEASE_S
    if django_settings.REDIS_URL:
        import redis

        from django_q.conf import Conf

        redis.Redis.from_url(django_settings.REDIS_URL).delete(f"django_q:{Conf.PREFIX}:q")  # stale tasks of other tests
    started = []

    def start():
        started.append(Cluster(tmp_path))
        return started[-1]

    yield start
    for cluster in started:
        cluster.stop()


def _wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _status(batch):
    return Batch.objects.filter(pk=batch.pk).values_list("status", flat=True).get()


def _assert_exactly_once(batch, total):
    batch.refresh_from_db()
    out, err = read_lines(batch.output_file), read_lines(batch.error_file)
    ids = [line["custom_id"] for line in out + err]
    assert len(ids) == total and len(set(ids)) == total
    assert (batch.completed_count, batch.failed_count) == (len(out), len(err))
    assert batch.input_tokens == sum(l["response"]["body"]["usage"]["prompt_tokens"] for l in out)
    assert batch.output_tokens == sum(l["response"]["body"]["usage"]["completion_tokens"] for l in out)
    return out, err


@pytest.mark.slow
def test_two_workers_share_one_batch(alice, model, sim, clusters):
    batch = make_batch(alice.org, [chat(f"q{i} [[latency:20]]") for i in range(400)])
    clusters()
    enqueue_batch(batch.pk, copies=2)
    _wait_for(lambda: _status(batch) == "completed", 60, "the batch to complete")
    out, err = _assert_exactly_once(batch, 400)
    assert not err
    owners = Record.objects.filter(batch=batch).values_list("attempts", flat=True)
    assert set(owners) == {1}


@pytest.mark.slow
def test_kill_9_mid_batch_loses_nothing_and_counts_nothing_twice(alice, model, clusters):
    with run_in_thread(SimulatorConfig(latency_ms=15)) as slow:
        model.deployments.update(base_url=slow.base_url)
        batch = make_batch(alice.org, [chat(f"q{i}") for i in range(1500)] + [chat("bad [[status:400]]")])
        first = clusters()
        enqueue_batch(batch.pk)
        _wait_for(lambda: Record.objects.filter(batch=batch, status="succeeded").count() >= 100, 60, "progress")
        first.kill()
        done_at_kill = Record.objects.filter(batch=batch, status="succeeded").count()
        assert done_at_kill < 1500, "the batch finished before the kill; the test proves nothing"
        clusters()
        # No worker is alive for the batch; once the dead leases run out the sweeper hands it out again.
        _wait_for(lambda: sweep()["requeued"] > 0 or _status(batch) == "completed", 30, "the sweeper to re-queue")
        _wait_for(lambda: _status(batch) == "completed", 90, "the batch to complete")
    out, err = _assert_exactly_once(batch, 1501)
    assert [e["custom_id"] for e in err] == ["req-1501"]
    assert Record.objects.filter(batch=batch, attempts__gt=1).exists()
