"""Real clients against real ASGI servers of the app: uvicorn (and daphne) processes on the test database.

pytest-django's live_server is a WSGI server that can't read a chunked
body, so these tests start `python -m uvicorn openrelay.asgi:application`
(and daphne) themselves, as docs/guides/production.md runs it. Each server
gets a data directory of its own (stored files, upload temp files), which
the tests look into to check that nothing of a refused upload is kept.
"""

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.conf import settings as django_settings

from openrelay.lib import children
from openrelay.simulator.config import SimulatorConfig
from openrelay.simulator.server import run_in_thread
from tests.helpers import MODEL, ROOT, database_url, deploy, free_port

SERVERS = {
    "uvicorn": lambda port: [
        "-m",
        "uvicorn",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--no-access-log",
        "--log-level",
        "warning",
        "openrelay.asgi:application",
    ],
    "daphne": lambda port: ["-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "openrelay.asgi:application"],
}


def wait_for(predicate, what, timeout=30):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


def chat_line(custom_id, content="hello"):
    return (
        b'{"custom_id": "%s", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "%s", '
        b'"messages": [{"role": "user", "content": "%s"}]}}\n'
    ) % (custom_id.encode(), MODEL.encode(), content.encode())


@dataclass
class Process:
    """A child process in its own process group, logging to a file under the data dir."""

    popen: subprocess.Popen
    log: Path

    def alive(self):
        assert self.popen.poll() is None, f"{self.popen.args} exited: {self.log.read_text()[-2000:]}"
        return True

    def stop(self):
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(timeout=10)


def child_env(data_dir):
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "OPENRELAY_DATA_DIR": str(data_dir),
        "OPENRELAY_ALLOW_PRIVATE_URLS": "true",
        "OPENRELAY_LOG_LEVEL": "WARNING",
        "OPENRELAY_Q_WORKERS": "2",
    }
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    return env


def start(name, argv, data_dir):
    log = data_dir / f"{name}.log"
    with log.open("wb") as out:
        popen = children.popen(
            [sys.executable, *argv],
            cwd=ROOT,
            env=child_env(data_dir),
            start_new_session=True,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return Process(popen, log)


@dataclass
class WebServer:
    url: str
    data_dir: Path
    process: Process

    @property
    def storage(self):
        return self.data_dir / "files"

    @property
    def temp(self):
        return self.data_dir / "tmp"


def _listening(process, port):
    process.alive()
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


def _web_server(kind, tmp_path_factory):
    data_dir, port = tmp_path_factory.mktemp(kind), free_port()
    process = start(kind, SERVERS[kind](port), data_dir)
    try:
        wait_for(lambda: _listening(process, port), f"{kind} to listen")
        yield WebServer(f"http://127.0.0.1:{port}", data_dir, process)
    finally:
        process.stop()


@pytest.fixture(scope="module")
def uvicorn_server(django_db_setup, tmp_path_factory):
    yield from _web_server("uvicorn", tmp_path_factory)


@pytest.fixture(scope="module")
def daphne_server(django_db_setup, tmp_path_factory):
    yield from _web_server("daphne", tmp_path_factory)


@pytest.fixture
def model(transactional_db):
    """Overrides the shared `model`: MODEL on a simulator of the test's own with the default config."""
    with run_in_thread(SimulatorConfig()) as sim:
        yield deploy(MODEL, sim.base_url, upstream_model="x")


@pytest.fixture
def worker(uvicorn_server, model):
    """`manage.py qcluster` on the test database and the web server's data dir, killed after the test."""
    if django_settings.REDIS_URL:
        import redis
        from django_q.conf import Conf

        # Tasks other tests enqueued without a worker would be run first.
        redis.Redis.from_url(django_settings.REDIS_URL).delete(f"django_q:{Conf.PREFIX}:q")
    process = start("qcluster", ["manage.py", "qcluster"], uvicorn_server.data_dir)
    yield process
    process.stop()
