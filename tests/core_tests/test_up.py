"""The README's first command: `manage.py up` runs the whole product on the embedded defaults."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from openrelay.lib import children
from tests.helpers import free_port

ROOT = Path(__file__).resolve().parents[2]
EMBEDDED_ONLY = ("DATABASE_URL", "REDIS_URL")
# `up` runs on the embedded defaults whatever the environment (these tests drop DATABASE_URL
# and REDIS_URL): the same on either pass, so CI runs them in one (the tier db_independent,
# pyproject.toml).


def _read_banner(process, deadline):
    lines = []
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        assert line, f"manage.py up exited early: {lines}"
        lines.append(line.rstrip("\n"))
        if lines[-2:-1] == ["API key:"]:
            return lines
    raise AssertionError(f"no banner: {lines}")


@pytest.mark.slow
def test_up_runs_web_workers_and_the_simulated_model(tmp_path):
    port, sim_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k not in EMBEDDED_ONLY}
    env["OPENRELAY_DATA_DIR"] = str(tmp_path)
    console = tmp_path / "console.err"  # what up and its children write to the terminal's stderr
    process = children.popen(
        [sys.executable, "manage.py", "up", "--port", str(port), "--simulator-port", str(sim_port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=console.open("wb"),
        text=True,
        start_new_session=True,
    )
    try:
        banner = _read_banner(process, time.monotonic() + 60)
        key = banner[-1]
        assert key.startswith("or_")
        assert any(f"http://127.0.0.1:{port}" in line for line in banner)
        password = next(line for line in banner if "Dashboard sign-in" in line).split("password ")[1].split()[0]
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{base}/v1/batches", headers={"Authorization": f"Bearer {key}"}).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the web server never answered"
            time.sleep(0.2)
        client = OpenAI(base_url=f"{base}/v1", api_key=key)
        line = (
            b'{"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions", '
            b'"body": {"model": "openrelay/gemma-4-31b", "messages": [{"role": "user", "content": "hi"}]}}\n'
        )
        file = client.files.create(file=("in.jsonl", line), purpose="batch")
        batch = client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")
        deadline = time.monotonic() + 60
        while batch.status != "completed":
            assert batch.status not in ("failed", "expired", "cancelled") and time.monotonic() < deadline, batch
            time.sleep(0.2)
            batch = client.batches.retrieve(batch.id)
        assert '"custom_id":"r1"' in client.files.content(batch.output_file_id).text
        assert batch.usage.total_tokens > 0
        unknown = httpx.get(f"{base}/v1/batches/batch_unknown", headers={"Authorization": f"Bearer {key}"})
        assert unknown.status_code == 404 and httpx.get(f"{base}/v1/batches").status_code == 401
        with httpx.Client(base_url=base) as browser:
            form = browser.get("/login")
            token = browser.cookies["csrftoken"]
            signed_in = browser.post(
                "/login",
                data={"username": "dev", "password": password, "csrfmiddlewaretoken": token},
                headers={"Referer": f"{base}/login"},
                follow_redirects=True,
            )
            assert form.status_code == 200 and batch.id in signed_in.text
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            raise
    assert process.returncode is not None
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{sim_port}/v1/models", timeout=2)
    # The development SECRET_KEY is said once (not once a process), and clients' 4xx answers are not logged.
    said = console.read_text()
    assert said.count("SECRET_KEY is not set") == 1, said
    assert "Not Found:" not in said and "Unauthorized:" not in said, said


def _start_up(tmp_path, port, sim_port, console=None):
    """`manage.py up` on the embedded defaults; its stderr (and its children's) to `console` if given."""
    env = {k: v for k, v in os.environ.items() if k not in EMBEDDED_ONLY}
    env["OPENRELAY_DATA_DIR"] = str(tmp_path)
    process = children.popen(
        [sys.executable, "manage.py", "up", "--port", str(port), "--simulator-port", str(sim_port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=console.open("wb") if console else subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    return process, _read_banner(process, time.monotonic() + 60)[-1]


def _submit(client, tag, count, latency_ms):
    lines = b"".join(
        b'{"custom_id": "%s%d", "method": "POST", "url": "/v1/chat/completions", "body": {"model": '
        b'"openrelay/gemma-4-31b", "messages": [{"role": "user", "content": "q%d [[latency:%d]]"}]}}\n'
        % (tag.encode(), i, i, latency_ms)
        for i in range(count)
    )
    file = client.files.create(file=("in.jsonl", lines), purpose="batch")
    return client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")


def _wait(predicate, what, timeout=60):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _wait_for_text(path, text, timeout=30):
    deadline = time.monotonic() + timeout
    while text not in path.read_text(errors="replace"):
        assert time.monotonic() < deadline, f"{text!r} never said: {path.read_text(errors='replace')[-2000:]}"
        time.sleep(0.05)


def _running(tmp_path, batch_id):
    import sqlite3

    with sqlite3.connect(tmp_path / "openrelay.sqlite3") as db:
        query = (
            "SELECT COUNT(*) FROM batches_record r JOIN batches_batch b ON b.id = r.batch_id "
            "WHERE b.public_id = ? AND r.status = 'running'"
        )
        return db.execute(query, (batch_id,)).fetchone()[0]


def _record_statuses(tmp_path):
    import sqlite3

    with sqlite3.connect(tmp_path / "openrelay.sqlite3") as db:
        return dict(db.execute("SELECT status, COUNT(*) FROM batches_record GROUP BY status").fetchall())


@pytest.mark.slow
def test_ctrl_c_on_up_mid_batch_writes_nothing_off_and_a_restart_finishes_it(tmp_path):
    """Ctrl-C reaches `up` (its children have sessions of their own): it says what it stops, and stops
    the workers before the simulator, so calls in flight finish or go back to pending; none fails. A
    second Ctrl-C mid-stop stops the rest at once, in the same order, without a traceback; the next
    start runs every record of both batches."""
    port, sim_port = free_port(), free_port()
    console = tmp_path / "console.err"
    process, key = _start_up(tmp_path, port, sim_port, console)
    try:
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=5)
        first = _submit(client, "a", 600, latency_ms=700)
        _wait(lambda: client.batches.retrieve(first.id).request_counts.completed >= 64, "progress")
        os.killpg(process.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends to its foreground group
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    statuses = _record_statuses(tmp_path)
    assert statuses.get("failed", 0) == 0 and statuses.get("running", 0) == 0, statuses
    assert statuses.get("pending", 0) > 0, f"the batch finished before the stop; the test proves nothing: {statuses}"
    said = console.read_text()
    assert process.returncode == 0, said
    for step in ("Stopping. Press Ctrl-C again", "Stopping the web server", "Stopping the workers", "Stopped."):
        assert step in said, said
    assert said.index("Stopping the workers") < said.index("Stopping the simulated model server"), said
    assert "Traceback" not in said and "leaves the rotation" not in said, said

    console = tmp_path / "console-2.err"  # its own: the first start's lines must not answer the waits below
    process, key = _start_up(tmp_path, port, sim_port, console)
    try:
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=5)
        # Calls of 8 s: the workers' graceful stop waits for them, so the second Ctrl-C comes mid-stop.
        second = _submit(client, "b", 40, latency_ms=8000)
        _wait(lambda: _running(tmp_path, second.id) > 0, "its calls in flight")  # not the first batch's
        os.killpg(process.pid, signal.SIGINT)
        _wait_for_text(console, "Stopping the workers")
        os.killpg(process.pid, signal.SIGINT)  # the impatient second Ctrl-C
        started = time.monotonic()
        process.wait(timeout=30)
        stopped_in = time.monotonic() - started
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    said = console.read_text()
    assert "Stopping at once" in said and "Traceback" not in said and "KeyboardInterrupt" not in said, said
    assert stopped_in < 15, f"a second Ctrl-C took {stopped_in:.1f} s"
    assert _record_statuses(tmp_path).get("failed", 0) == 0

    process, key = _start_up(tmp_path, port, sim_port)
    try:
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=5)
        deadline = time.monotonic() + 90
        for batch, total in ((first, 600), (second, 40)):
            while (done := client.batches.retrieve(batch.id)).status != "completed":
                assert time.monotonic() < deadline, done
                time.sleep(0.2)
            assert (done.request_counts.completed, done.request_counts.failed) == (total, 0)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)
