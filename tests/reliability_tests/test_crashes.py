"""Crashes: worker processes killed with -9 again and again, the database and the
broker restarted mid-batch, the web process killed mid-upload.

Every time the batch finishes, each record appears exactly once across the
output and error files, and billed usage (the batch's input/output tokens)
equals the sum over the output lines. Real processes throughout: qcluster
workers (the `clusters` fixture), the simulated model
server, the ASGI web server `manage.py up` runs.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.db import connection, connections

from batches.models import Record
from files.models import File
from openrelay.lib import children
from openrelay.simulator.config import SimulatorConfig
from openrelay.simulator.server import run_in_thread
from tests.helpers import (
    assert_exactly_once,
    chat,
    database_url,
    free_port,
    make_batch,
    status_of,
    succeeded,
    wait_for,
)

ROOT = Path(__file__).resolve().parents[2]
RECORDS = 3000


@pytest.fixture
def slow_model(model):
    """The catalog model on a simulator slow enough that a batch outlives a few crashes."""
    with run_in_thread(SimulatorConfig(latency_ms=25)) as sim:
        model.deployments.update(base_url=sim.base_url, max_concurrency=16)
        yield model


@pytest.mark.slow
def test_repeated_kill_9_of_the_workers(alice, slow_model, clusters):
    batch = make_batch(alice.org, [chat(f"q{i}") for i in range(RECORDS - 1)] + [chat("bad [[status:400]]")])
    # Short leases: what is tested is exactly-once across kills; how soon a dead engine's
    # records come back at the default lease is test_workers' kill -9 test.
    lease = {"OPENRELAY_LEASE_S": 3}
    cluster = clusters(**lease)
    for kill_at in (RECORDS // 10, RECORDS * 4 // 10, RECORDS * 7 // 10):
        wait_for(lambda: succeeded(batch) >= kill_at, 60, f"{kill_at} records done")  # noqa: B023 - called here
        cluster.kill()
        assert status_of(batch) == "in_progress", "the batch finished before the kill; the test proves nothing"
        cluster = clusters(**lease)
    # No sweeper: the new engines claim the dead ones' records once their leases run out.
    wait_for(lambda: status_of(batch) == "completed", 90, "the batch to complete")
    out, err = assert_exactly_once(batch, RECORDS)
    assert [line["custom_id"] for line in err] == [f"req-{RECORDS}"]
    # The kills really cut work short: some records ran more than once, none was written twice.
    assert Record.objects.filter(batch=batch, attempts__gt=1).exists()


# --- PostgreSQL and Redis restarts ------------------------------------------------------------


def _postgres_cluster():
    versions = sorted(os.listdir("/etc/postgresql")) if os.path.isdir("/etc/postgresql") else []
    return versions[-1] if versions else None


def _wait_until(check, timeout, what):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _postgres_ready():
    return subprocess.run(["pg_isready", "-h", "127.0.0.1", "-p", "5432"], capture_output=True).returncode == 0


@pytest.mark.slow
@pytest.mark.exclusive
@pytest.mark.skipif(
    connection.vendor != "postgresql" or not _postgres_cluster() or not shutil.which("pg_ctlcluster"),
    reason="restarts PostgreSQL: only when the tests run against it",
)
def test_a_postgresql_restart_mid_batch(alice, slow_model, clusters):
    batch = make_batch(alice.org, [chat(f"q{i}") for i in range(1500)])
    cluster = clusters()
    wait_for(lambda: succeeded(batch) >= 200, 60, "progress")
    assert succeeded(batch) < 1000, "the batch is nearly done before the restart; the test proves little"
    try:
        subprocess.run(
            ["pg_ctlcluster", "--skip-systemctl-redirect", _postgres_cluster(), "main", "restart"],
            check=True,
            capture_output=True,
            timeout=60,
        )
    finally:
        _wait_until(_postgres_ready, 60, "PostgreSQL to accept connections again")
    connections.close_all()  # this process's connection died with the server
    # The engines live through it (batches/engine/dbretry.py): the batch completes
    # without any record claimed twice, and the cluster never restarts.
    wait_for(lambda: status_of(batch) == "completed", 45, "the batch to complete in the same engines")
    assert cluster.process.poll() is None, "the worker cluster died with the database"
    assert_exactly_once(batch, 1500)
    # No engine died: a dead engine's records would have been claimed again once its leases ran out.
    assert not Record.objects.filter(batch=batch, attempts__gt=1).exists()


def _redis_ready():
    return (
        subprocess.run(
            ["redis-cli", "-h", "127.0.0.1", "-p", "6379", "ping"], capture_output=True, text=True
        ).stdout.strip()
        == "PONG"
    )


def _start_redis():
    Path("/var/lib/redis").mkdir(parents=True, exist_ok=True)
    Path("/var/log/redis").mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            "redis-server",
            "--daemonize",
            "yes",
            "--bind",
            "127.0.0.1",
            "-::1",
            "--port",
            "6379",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            "/var/lib/redis",
            "--logfile",
            "/var/log/redis/ci.log",
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )


@pytest.mark.slow
@pytest.mark.exclusive
@pytest.mark.skipif(
    not django_settings.REDIS_URL or not shutil.which("redis-server"),
    reason="restarts Redis: only when REDIS_URL is set",
)
def test_a_redis_restart_mid_batch(alice, slow_model, clusters):
    batch = make_batch(alice.org, [chat(f"q{i}") for i in range(1500)])
    cluster = clusters()
    wait_for(lambda: succeeded(batch) >= 200, 60, "progress")
    assert succeeded(batch) < 1000, "the batch is nearly done before the restart; the test proves little"
    try:
        subprocess.run(
            ["redis-cli", "-h", "127.0.0.1", "-p", "6379", "shutdown", "nosave"], capture_output=True, timeout=30
        )
        _wait_until(lambda: not _redis_ready(), 10, "Redis to stop")
        time.sleep(0.5)  # a deliberate sleep: the broker stays down a moment while the batch runs
    finally:
        if not _redis_ready():
            _start_redis()
        _wait_until(_redis_ready, 30, "Redis to answer again")
    wait_for(lambda: status_of(batch) == "completed", 45, "the batch to complete in the same engines")
    assert cluster.process.poll() is None, "the worker cluster died with the broker"
    assert_exactly_once(batch, 1500)
    assert not Record.objects.filter(batch=batch, attempts__gt=1).exists()
    # The broker works again: a task queued now runs.
    from django_q.tasks import async_task, result

    task_id = async_task("batches.tasks.sweep")
    wait_for(lambda: result(task_id) is not None, 30, "a task queued after the restart")


# --- the web process killed mid-upload --------------------------------------------------------


class WebServer:
    """The ASGI web server as `manage.py up` runs it, on the test database."""

    def __init__(self, data_dir):
        self.port = free_port()
        env = {**os.environ, "DATABASE_URL": database_url(), "OPENRELAY_DATA_DIR": str(data_dir)}
        self.process = children.popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--no-access-log",
                "openrelay.asgi:application",
            ],
            cwd=ROOT,
            env=env,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_until(self._listening, 30, "the web server to listen")

    def _listening(self):
        assert self.process.poll() is None, "the web server exited"
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return True
        except OSError:
            return False

    def kill(self):
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)


def _stored_files(data_dir):
    root = Path(data_dir) / "files"
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


@pytest.mark.slow
def test_the_web_process_killed_mid_upload_leaves_nothing(alice, tmp_path, settings, transactional_db):
    settings.STORAGES = {
        **settings.STORAGES,
        "default": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path / "files")},
        },
    }
    server = WebServer(tmp_path)
    line = (
        b'{"custom_id": "r%d", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m", '
        b'"messages": [{"role": "user", "content": "' + b"x" * 900 + b'"}]}}\n'
    )
    boundary = "reliability-boundary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="big.jsonl"\r\n'
        f"Content-Type: application/jsonl\r\n\r\n"
    ).encode()
    declared = 40 * 1024 * 1024
    sock = socket.create_connection(("127.0.0.1", server.port))
    try:
        sock.sendall(
            (
                f"POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {alice.key}\r\n"
                f"Content-Type: multipart/form-data; boundary={boundary}\r\n"
                f"Content-Length: {declared}\r\n\r\n"
            ).encode()
            + head
        )
        sent = 0
        chunk = b"".join(line % i for i in range(1000))
        while sent < 12 * 1024 * 1024:  # well into the body, well short of its end
            sock.sendall(chunk)
            sent += len(chunk)
        server.kill()
    finally:
        sock.close()
    assert not File.objects.exists()
    assert _stored_files(tmp_path) == []
    temp_dir = tmp_path / "tmp"  # FILE_UPLOAD_TEMP_DIR: no half-written upload left behind either
    assert not temp_dir.exists() or [p for p in temp_dir.iterdir() if p.is_file()] == []
    # A new web process takes uploads as before.
    server = WebServer(tmp_path)
    try:
        body = head + b"".join(line % i for i in range(3)) + f"\r\n--{boundary}--\r\n".encode()
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(
                (
                    f"POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {alice.key}\r\n"
                    f"Content-Type: multipart/form-data; boundary={boundary}\r\nConnection: close\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n"
                ).encode()
                + body
            )
            answer = b""
            while data := sock.recv(65536):
                answer += data
        assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
        assert File.objects.count() == 1 and len(_stored_files(tmp_path)) == 1
    finally:
        server.kill()
