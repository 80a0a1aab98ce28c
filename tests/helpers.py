"""Plain helpers shared by several test packages (not fixtures: those are in tests/fixtures/).

Import them: `from tests.helpers import chat, make_batch, wait_for`. A helper
only one package uses stays in that package's conftest or helpers module.
"""

import asyncio
import gc
import socket
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import orjson
from django.db import InterfaceError, OperationalError, connection, connections
from django.utils import timezone
from rest_framework.test import APIClient

from batches.engine.calls.usage import Usage
from batches.engine.outcomes import RecordOutcome
from batches.models import Batch, Record
from files import services as file_services
from openrelay.core.models import ApiKey, Deployment, Model, Organization

ROOT = Path(__file__).resolve().parents[1]
MODEL = "openrelay/gemma-4-31b"
CHAT = "/v1/chat/completions"
# One chat completion record as an input file line (bytes).
CHAT_LINE = (
    b'{"custom_id": "req-1", "method": "POST", "url": "/v1/chat/completions", '
    b'"body": {"model": "openrelay/gemma-4-31b", "messages": [{"role": "user", "content": "Hi"}]}}\n'
)


# --- organizations -------------------------------------------------------------------------


@dataclass
class Persona:
    org: Organization
    key: str
    client: APIClient


def make_persona(name, **org_fields):
    """An organization with an API key, and an API client that sends it."""
    org = Organization.objects.create(name=name, **org_fields)
    _, key = ApiKey.issue(org, name=f"{name} key")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return Persona(org=org, key=key, client=client)


# --- the catalog and batches ---------------------------------------------------------------


def deploy(name, base_url, *, upstream_model="sim-upstream", max_concurrency=16):
    """A catalog model served by one deployment at `base_url`."""
    model = Model.objects.create(name=name)
    Deployment.objects.create(
        model=model, base_url=base_url, upstream_model=upstream_model, max_concurrency=max_concurrency
    )
    return model


def chat(content, **extra):
    """A chat completion body for MODEL."""
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}


def make_batch(org, bodies=None, *, endpoint=CHAT, window=timedelta(hours=24), model=None, **rollups):
    """A batch as create leaves it: an input file and records pointing into it (custom_ids req-1, req-2, ...).

    Without `bodies`: a batch row only, as the engine leaves it mid-way, for the pages and sockets that
    read nothing but its roll-ups (see `_rollup_batch`)."""
    if bodies is None:
        return _rollup_batch(org, endpoint=endpoint, window=window, model=model, **rollups)
    lines = [
        orjson.dumps({"custom_id": f"req-{i}", "method": "POST", "url": endpoint, "body": body}) + b"\n"
        for i, body in enumerate(bodies, start=1)
    ]
    file = file_services.create_file_from_chunks(organization=org, filename="in.jsonl", purpose="batch", chunks=lines)
    file_services.pin(file)
    now = timezone.now()
    batch = Batch.objects.create(
        organization=org,
        endpoint=endpoint,
        model_name=MODEL,
        model=model or Model.objects.get(name=MODEL),
        input_file=file,
        input_file_public_id=file.public_id,
        created_at=now,
        expires_at=now + window,
        total_count=len(lines),
        **rollups,
    )
    offset, records = 0, []
    for i, line in enumerate(lines, start=1):
        records.append(Record(batch=batch, line=i, custom_id=f"req-{i}", offset=offset, length=len(line)))
        offset += len(line)
    Record.objects.bulk_create(records)
    return batch


def _rollup_batch(
    org, *, endpoint, window, model, status="in_progress", total=10, completed=0, failed=0, input_file=None, **fields
):
    """`status`, `total`, `completed` and `failed` as given; no records, and no model unless given."""
    file = input_file or stored_file(org)
    now = timezone.now()
    fields = {"model_name": MODEL, "model": model, **fields}
    return Batch.objects.create(
        organization=org,
        input_file=file,
        input_file_public_id=file.public_id,
        endpoint=endpoint,
        status=status,
        created_at=now,
        expires_at=now + window,
        in_progress_at=now if status != "validating" else None,
        total_count=total,
        completed_count=completed,
        failed_count=failed,
        **fields,
    )


def stored_file(org, content=b'{"custom_id": "a"}\n', filename="in.jsonl", purpose="batch"):
    """A stored file of the organization's, expiring as an upload's would."""
    return file_services.create_file_from_chunks(
        organization=org,
        filename=filename,
        purpose=purpose,
        chunks=[content],
        expires_at=file_services.default_expiry(purpose),
    )


def read_lines(file):
    """The JSON lines of a stored File ([] for None)."""
    if file is None:
        return []
    with file_services.open_content(file) as f:
        return [orjson.loads(line) for line in f.read().splitlines()]


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


# --- waiting -------------------------------------------------------------------------------


def sessions_where(condition):
    """PostgreSQL: the sessions of the test database that meet `condition` (SQL on pg_stat_activity),
    counted afresh (the statistics view stays as first read in a transaction unless cleared)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(f"SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND {condition}")
        return cursor.fetchone()[0]


def wait_for(predicate, timeout, what, every=0.05):
    """Poll `predicate` until it is true; fail after `timeout` seconds, saying `what` was awaited (a
    callable `what` is called then, to say how things stood). Returns the seconds it took.

    The suite's one polling loop (no sleeping to wait for work). A database error (the database
    restarting under us) counts as not yet.
    """
    started = time.monotonic()
    deadline = started + timeout
    while True:
        try:
            if predicate():
                return time.monotonic() - started
        except (OperationalError, InterfaceError):
            connections.close_all()
        assert time.monotonic() < deadline, f"timed out waiting for {what() if callable(what) else what}"
        time.sleep(every)


# --- processes and files -------------------------------------------------------------------


def database_url():
    """The test database as a DATABASE_URL, for the processes a test starts."""
    s = connection.settings_dict
    if s["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{s['NAME']}"
    return f"postgres://{s['USER']}@{s['HOST']}:{s['PORT']}/{s['NAME']}"


def free_port():
    """A port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stored_files(directory):
    """Every file under `directory`, as sorted relative paths."""
    return sorted(p.relative_to(directory).as_posix() for p in Path(directory).rglob("*") if p.is_file())


def streamed_multipart(fields, file_size, *, filename="upload", chunk=1024 * 1024):
    """A hand-made multipart/form-data body for httpx: (headers, generator).

    The file part holds `file_size` bytes of JSONL (a chat line, then padding
    lines), produced `chunk` bytes at a time so the test never holds it whole.
    """
    boundary = "openrelay-test-boundary-7d1f0c2a"
    head = b"".join(
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
        for name, value in fields.items()
    )
    head += (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    tail = f"\r\n--{boundary}--\r\n".encode()
    padding_line = b'{"pad": "' + b"x" * 1012 + b'"}\n'  # 1 KiB
    block = CHAT_LINE + padding_line * (chunk // len(padding_line))
    block = block[:chunk]

    def body():
        yield head
        sent = 0
        while sent < file_size:
            piece = block[: min(chunk, file_size - sent)]
            sent += len(piece)
            yield piece
        yield tail

    headers = {
        "Content-Type": f"multipart/form-data; boundary={boundary}",
        "Content-Length": str(len(head) + file_size + len(tail)),
    }
    return headers, body()


class EngineThread:
    """One engine in a thread of the test process, as a worker process runs it, working the given
    batches (every batch when none are given) until stopped."""

    def __init__(self, *batch_pks):
        from batches.engine.runner import Engine

        self.engine = Engine(only=batch_pks or None)
        self.thread = threading.Thread(target=self._run)

    def _run(self):
        try:
            asyncio.run(self.engine.run())
        finally:
            connections.close_all()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.engine.request_stop()
        self.thread.join(timeout=60)
        assert not self.thread.is_alive()
        # The engine's threads (its closer) end without closing their database connections; collected
        # here, or PostgreSQL refuses to drop the test database while they are open.
        gc.collect()


def answered(tokens):
    """A successful call's outcome billing `tokens` input tokens and one output token."""
    return RecordOutcome(True, 200, "req", {"usage": {}}, usage=Usage(prompt_tokens=tokens, completion_tokens=1))
