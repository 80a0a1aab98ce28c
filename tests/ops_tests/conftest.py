"""Ops fixtures: a real web process (uvicorn) started with the environment a test gives it."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from openrelay.lib import children
from tests.helpers import ROOT, free_port


def closed_port():
    """A port nothing listens on (bound and released: the kernel won't hand it out at once)."""
    return free_port()


class WebProcess:
    """`uvicorn openrelay.asgi:application` in its own session, logging under the data dir."""

    def __init__(self, data_dir, **env):
        self.port = free_port()
        env = {**os.environ, "OPENRELAY_DATA_DIR": str(data_dir), **{k: str(v) for k, v in env.items()}}
        self.log = open(Path(data_dir) / f"web-{self.port}.log", "wb")
        self.process = children.popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "openrelay.asgi:application",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--no-access-log",
            ],
            cwd=ROOT,
            env=env,
            start_new_session=True,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.url = f"http://127.0.0.1:{self.port}"
        self._wait_listening()

    def _wait_listening(self, timeout=30):
        deadline = time.monotonic() + timeout
        while True:
            assert self.process.poll() is None, Path(self.log.name).read_text()
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return
            assert time.monotonic() < deadline, "the web process did not start listening"
            time.sleep(0.05)

    def get(self, path, **kwargs):
        return httpx.get(self.url + path, timeout=30, **kwargs)

    def stop(self):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)
        self.log.close()


@pytest.fixture
def web(tmp_path):
    """Start real web processes with `web(**env)`; every one is killed at the end."""
    started = []

    def start(**env):
        started.append(WebProcess(tmp_path, **env))
        return started[-1]

    yield start
    for process in started:
        process.stop()
