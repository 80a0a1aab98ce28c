"""Engine fixtures: a real simulated model server, a catalog model on it, batches."""

import contextlib
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import orjson
import pytest
from django.conf import settings as django_settings
from django.db import InterfaceError, OperationalError, connection, connections
from django.utils import timezone

from batches.models import Batch, Record
from files import services as file_services
from openrelay.core.models import Deployment, Model
from openrelay.simulator.config import SimulatorConfig
from openrelay.simulator.server import run_in_thread

MODEL = "openrelay/gemma-4-31b"


@pytest.fixture(autouse=True)
def _storage(settings, tmp_path):
    settings.STORAGES = {**settings.STORAGES, "default": {
        "BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "files")}}}


@pytest.fixture
def sim():
    with run_in_thread(SimulatorConfig(retry_after_s=0.2)) as server:
        yield server


@pytest.fixture
def model(transactional_db, sim):
    model = Model.objects.create(name=MODEL)
    Deployment.objects.create(model=model, base_url=sim.base_url, upstream_model="sim-upstream", max_concurrency=16)
    return model


def chat(content, **extra):
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}


def make_batch(org, bodies, *, endpoint="/v1/chat/completions", window=timedelta(hours=24), model=None):
    """A batch as create leaves it: an input file and records pointing into it."""
    lines = [
        orjson.dumps({"custom_id": f"req-{i}", "method": "POST", "url": endpoint, "body": body}) + b"\n"
        for i, body in enumerate(bodies, start=1)
    ]
    file = file_services.create_file_from_chunks(organization=org, filename="in.jsonl", purpose="batch", chunks=lines)
    file_services.pin(file)
    now = timezone.now()
    batch = Batch.objects.create(
        organization=org, endpoint=endpoint, model_name=MODEL, model=model or Model.objects.get(name=MODEL),
        input_file=file, input_file_public_id=file.public_id, created_at=now, expires_at=now + window,
        total_count=len(lines),
    )
    offset, records = 0, []
    for i, line in enumerate(lines, start=1):
        records.append(Record(batch=batch, line=i, custom_id=f"req-{i}", offset=offset, length=len(line)))
        offset += len(line)
    Record.objects.bulk_create(records)
    return batch


def read_lines(file):
    if file is None:
        return []
    with file_services.open_content(file) as f:
        return [orjson.loads(line) for line in f.read().splitlines()]


# --- real worker clusters ---------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]


def database_url():
    s = connection.settings_dict
    if s["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{s['NAME']}"
    return f"postgres://{s['USER']}@{s['HOST']}:{s['PORT']}/{s['NAME']}"


class Cluster:
    """`manage.py qcluster` in its own session (as systemd or docker runs it): every worker
    process runs an engine, on the test database."""

    def __init__(self, data_dir, **env):
        env = {**os.environ, "DATABASE_URL": database_url(), "OPENRELAY_DATA_DIR": str(data_dir),
               "OPENRELAY_Q_WORKERS": "2", "OPENRELAY_ALLOW_PRIVATE_URLS": "true",
               **{name: str(value) for name, value in env.items()}}
        self.log = open(Path(data_dir) / f"cluster-{time.monotonic_ns()}.log", "wb")
        self.process = subprocess.Popen([sys.executable, "manage.py", "qcluster"], cwd=ROOT, env=env,
                                        start_new_session=True, stdout=self.log, stderr=subprocess.STDOUT)

    def kill(self):
        """kill -9 of the cluster and every worker it forked."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def terminate(self, timeout=60):
        """SIGTERM to qcluster alone (what docker and Kubernetes send); wait for it to exit."""
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=timeout)

    def stop(self):
        if self.process.poll() is None:
            self.kill()
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)  # a worker left behind
        self.log.close()


@pytest.fixture
def clusters(tmp_path, settings):
    """Start real clusters with `clusters(**env)`; every one is killed at the end."""
    settings.STORAGES = {**settings.STORAGES, "default": {
        "BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "files")}}}
    if django_settings.REDIS_URL:
        import redis
        from django_q.conf import Conf

        redis.Redis.from_url(django_settings.REDIS_URL).delete(f"django_q:{Conf.PREFIX}:q")  # stale tasks of other tests
    started = []

    def start(**env):
        started.append(Cluster(tmp_path, **env))
        return started[-1]

    yield start
    for cluster in started:
        cluster.stop()


def wait_for(predicate, timeout, what, every=0.05):
    """Poll `predicate` until it is true; fail after `timeout` seconds. Returns the seconds it took."""
    started = time.monotonic()
    deadline = started + timeout
    while True:
        try:
            if predicate():
                return time.monotonic() - started
        except (OperationalError, InterfaceError):  # the database may be restarting under us
            connections.close_all()
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every)


def status_of(batch):
    return Batch.objects.filter(pk=batch.pk).values_list("status", flat=True).get()


def succeeded(batch):
    return Record.objects.filter(batch=batch, status="succeeded").count()


def assert_exactly_once(batch, total):
    """Every record once across the output and error files; billed usage = the output lines' usage."""
    batch.refresh_from_db()
    out, err = read_lines(batch.output_file), read_lines(batch.error_file)
    ids = [line["custom_id"] for line in out + err]
    assert len(ids) == total and len(set(ids)) == total, (len(ids), len(set(ids)))
    assert set(ids) == {f"req-{i}" for i in range(1, total + 1)}
    assert (batch.completed_count, batch.failed_count) == (len(out), len(err))
    assert batch.input_tokens == sum(line["response"]["body"]["usage"]["prompt_tokens"] for line in out)
    assert batch.output_tokens == sum(line["response"]["body"]["usage"]["completion_tokens"] for line in out)
    return out, err
