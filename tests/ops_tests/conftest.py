"""Ops fixtures: a real web process (uvicorn) started with the environment a test gives it; an S3 store
(moto's standalone server) for the object-storage tests."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import boto3
import httpx
import pytest

from files import storage
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


# ---------------------------------------------------------------------------
# S3 (test_object_storage.py, test_storage_unavailable.py)

BUCKET = "openrelay-files"
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture
def s3(tmp_path, monkeypatch):
    """moto_server on a free port with an empty bucket; yields the storage URL."""
    port = free_port()
    log = open(tmp_path / "moto.log", "wb")
    process = children.popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
            assert time.monotonic() < deadline and process.poll() is None, "moto_server did not start"
            time.sleep(0.05)
        for name, value in CREDENTIALS.items():
            monkeypatch.setenv(name, value)
        endpoint = f"http://127.0.0.1:{port}"
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
        yield f"s3://{BUCKET}/files?endpoint_url={endpoint}&region=us-east-1&addressing_style=path"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        log.close()


@pytest.fixture
def on_s3(s3, settings):
    settings.STORAGES = {**settings.STORAGES, "default": storage.storage_from_url(s3, "")}
    return s3
