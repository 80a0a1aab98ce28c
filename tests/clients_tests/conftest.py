"""Real clients against real ASGI servers of the app: uvicorn (and daphne) processes on the test database.

pytest-django's live_server is a WSGI server that can't read a chunked
body, so these tests start `python -m uvicorn openrelay.asgi:application`
(and daphne) themselves, as docs/guides/production.md runs it (tests/processes.py). Each server
gets a data directory of its own (stored files, upload temp files), which
the tests look into to check that nothing of a refused upload is kept.
"""

from dataclasses import dataclass
from pathlib import Path

import pytest

from openrelay.simulator.config import SimulatorConfig
from openrelay.simulator.server import run_in_thread
from tests import processes
from tests.helpers import MODEL, deploy
from tests.processes import WEB_SERVERS

SERVERS = WEB_SERVERS


def chat_line(custom_id, content="hello"):
    return (
        b'{"custom_id": "%s", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "%s", '
        b'"messages": [{"role": "user", "content": "%s"}]}}\n'
    ) % (custom_id.encode(), MODEL.encode(), content.encode())


def child_env(data_dir):
    return processes.product_env(data_dir, OPENRELAY_LOG_LEVEL="WARNING")


def start(name, argv, data_dir):
    """`python argv...` on the test database, logging under `data_dir`."""
    return processes.start(name, argv, data_dir, OPENRELAY_LOG_LEVEL="WARNING")


def _listening(process, port):
    return process.listens(port)


@dataclass
class WebServer:
    url: str
    data_dir: Path
    process: processes.Process

    @property
    def storage(self):
        return self.data_dir / "files"

    @property
    def temp(self):
        return self.data_dir / "tmp"


def _web_server(kind, tmp_path_factory):
    data_dir = tmp_path_factory.mktemp(kind)
    process = processes.web(kind, data_dir, OPENRELAY_LOG_LEVEL="WARNING")
    try:
        yield WebServer(process.url, data_dir, process)
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
    """`manage.py qcluster` on the test database and the web server's data dir, killed after the test.

    Tests that only need a running product take `live_stack` instead (one cluster for them all).
    """
    processes.clear_broker()  # tasks other tests enqueued without a worker would be run first
    process = processes.cluster(uvicorn_server.data_dir, OPENRELAY_LOG_LEVEL="WARNING")
    yield process
    process.stop()
