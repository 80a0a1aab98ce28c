"""CLI fixtures: a live API server, the simulated model, a real worker cluster, and `orl` runners.

The CLI only ever sees the HTTP API of pytest-django's live server. Uploaded
and generated files live under one data directory that the test process
(the live server) and the worker subprocess both use.
"""

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass

import pytest
from django.conf import settings as django_settings
from typer.testing import CliRunner

from openrelay.cli.app import app
from openrelay.lib import children
from openrelay.simulator.config import SimulatorConfig
from openrelay.simulator.server import run_in_thread
from tests.helpers import MODEL, ROOT, database_url, deploy

CHAT = "/v1/chat/completions"


@pytest.fixture
def data_dir(tmp_storage, tmp_path, settings):
    """Storage shared by the live server (this process) and worker subprocesses: tmp_storage, uploads in tmp_path."""
    settings.FILE_UPLOAD_TEMP_DIR = str(tmp_path)
    return tmp_path


@pytest.fixture
def base_url(live_server, data_dir):
    return f"{live_server.url}/v1"


@pytest.fixture
def model(transactional_db):
    """Overrides the shared `model`: MODEL on a simulator of the test's own with the default config, max_concurrency 8."""
    with run_in_thread(SimulatorConfig()) as sim:
        yield deploy(MODEL, sim.base_url, upstream_model="x", max_concurrency=8)


@dataclass
class Orl:
    """Runs `orl` in-process against the live server, as alice unless told otherwise."""

    base_url: str
    key: str

    def __call__(self, *args, key=..., base_url=None, env=None):
        env = {
            "OPENRELAY_API_KEY": self.key if key is ... else key,
            "OPENRELAY_BASE_URL": base_url or self.base_url,
            **(env or {}),
        }
        result = CliRunner().invoke(app, [str(arg) for arg in args], env=env)
        # Whatever happened, the key must not show up anywhere.
        assert self.key not in result.stdout + result.stderr
        return result

    def env(self):
        """The environment for `orl` as a real subprocess."""
        return {**os.environ, "OPENRELAY_API_KEY": self.key, "OPENRELAY_BASE_URL": self.base_url}


@pytest.fixture
def orl(base_url, alice):
    return Orl(base_url=base_url, key=alice.key)


def chat(custom_id, content="hello", model=MODEL):
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": CHAT,
        "body": {"model": model, "messages": [{"role": "user", "content": content}]},
    }


def write_jsonl(path, *records):
    """Dicts become JSON lines; strings are written as they are (broken lines)."""
    path.write_text("".join((json.dumps(r) if isinstance(r, dict) else r) + "\n" for r in records))
    return path


# ---------------------------------------------------------------------------
# A real django-q2 cluster (after tests/engine_tests/test_workers.py)


@pytest.fixture
def worker(data_dir, model):
    """`manage.py qcluster` on the test database, killed (with its workers) after the test."""
    if django_settings.REDIS_URL:
        import redis
        from django_q.conf import Conf

        # Tasks other tests enqueued without a worker would be run first.
        redis.Redis.from_url(django_settings.REDIS_URL).delete(f"django_q:{Conf.PREFIX}:q")
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "OPENRELAY_DATA_DIR": str(data_dir),
        "OPENRELAY_Q_WORKERS": "2",
        "OPENRELAY_ALLOW_PRIVATE_URLS": "true",
    }
    process = children.popen(
        [sys.executable, "manage.py", "qcluster"],
        cwd=ROOT,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    yield process
    # The database is the ledger: a kill loses nothing, and a graceful stop takes seconds.
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=10)
