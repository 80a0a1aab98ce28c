"""What one big answer costs an engine (issue 55, item 6): one embeddings answer of ~40 MB, run
by one engine in this process (`run_batch`) from a real HTTP server, its peak traced memory
(tracemalloc: Python's allocations, every thread's) as a multiple of the answer's bytes.

Measured before the fix: 4.9x (the answer read as bytes, parsed into Python objects that the
record held to its flush, its JSON text made again there as bytes then str, and the driver's
binary copy of that str). Bench row 15 (16 answers of 134 MB) is the full-size figure.
"""

import asyncio
import random
import socket
import threading
import tracemalloc

import orjson
import pytest
from django.db import connection, transaction

from batches.engine.runner import Engine, run_batch
from batches.models import Record
from tests.helpers import MODEL, deploy, make_batch, read_lines, sessions_where, status_of, wait_for

pytestmark = pytest.mark.usefixtures("tmp_storage")

DIMENSIONS = 3072
INPUTS = 600  # ~40 MB of JSON floats, as vLLM writes them
# The engine's peak over its idle allocations, at most this many times the answer's bytes.
PEAK_X = 3


def _answer(inputs):
    rng = random.Random(7)
    data = [
        {"object": "embedding", "index": i, "embedding": [rng.uniform(-1, 1) for _ in range(DIMENSIONS)]}
        for i in range(inputs)
    ]
    answer = {
        "object": "list",
        "data": data,
        "model": "up-model",
        "usage": {"prompt_tokens": 1200, "total_tokens": 1200},
    }
    return orjson.dumps(answer)


class OneAnswerServer:
    """Answers every POST with the same bytes, over blocking sockets (sendall copies nothing the
    test's tracemalloc would count)."""

    def __init__(self, answer):
        self.answer = answer
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.listener.close()

    def _accept(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        with conn:
            pending = b""
            while True:
                while b"\r\n\r\n" not in pending:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    pending += chunk
                head, _, pending = pending.partition(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    ),
                    0,
                )
                while len(pending) < length:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    pending += chunk
                pending = pending[length:]
                answer = self.answer if head.startswith(b"POST") else b"{}"
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(answer)
                )
                conn.sendall(answer)


@pytest.fixture
def big_answer():
    return _answer(INPUTS)


def test_one_big_answer_costs_an_engine_a_small_multiple_of_its_bytes(transactional_db, alice, big_answer):
    size = len(big_answer)
    with OneAnswerServer(big_answer) as server:
        deploy(MODEL, f"http://127.0.0.1:{server.port}/v1", upstream_model="up-model", max_concurrency=4)
        body = {"model": MODEL, "input": ["a text"], "dimensions": DIMENSIONS}
        warm = make_batch(alice.org, [{"model": MODEL, "input": ["warm"]}], endpoint="/v1/embeddings")
        run_batch(warm.pk)  # imports, connections, the catalog: not the answer's cost
        batch = make_batch(alice.org, [body], endpoint="/v1/embeddings")
        tracemalloc.start()
        try:
            idle = tracemalloc.get_traced_memory()[0]
            run_batch(batch.pk)
            peak = tracemalloc.get_traced_memory()[1] - idle
        finally:
            tracemalloc.stop()
    record = Record.objects.get(batch=batch)
    assert record.status == "succeeded" and record.prompt_tokens == 1200
    assert status_of(batch) == "completed"
    batch.refresh_from_db()
    line = read_lines(batch.output_file)[0]
    answer = line["response"]["body"]
    assert answer["model"] == MODEL and len(answer["data"]) == INPUTS
    assert answer["data"][5]["embedding"] == orjson.loads(big_answer)["data"][5]["embedding"]
    print(f"answer {size / 2**20:.1f} MB, peak {peak / 2**20:.1f} MB = {peak / size:.2f}x")
    assert peak < PEAK_X * size, f"peak {peak / size:.2f}x the answer's {size} bytes"


def _sessions():
    return sessions_where("backend_type = 'client backend'")  # an autovacuum worker shows the database too


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's sessions (pg_stat_activity)")
def test_an_engine_that_stops_leaves_no_database_session_open(transactional_db, alice, settings):
    # The flush apart's thread opened a connection of its own and never closed it (nor did the
    # engine's database thread and closer): a session per engine that ever ran, to the process's end.
    settings.OPENRELAY_FLUSH_APART_BYTES = 1024
    with OneAnswerServer(_answer(60)) as server:
        deploy(MODEL, f"http://127.0.0.1:{server.port}/v1", upstream_model="up-model", max_concurrency=4)
        batch = make_batch(alice.org, [{"model": MODEL, "input": ["a text"]}], endpoint="/v1/embeddings")
        baseline = _sessions()
        engine = Engine(only=[batch.pk], until_closed=True)
        asyncio.run(engine.run())
    assert engine.trips.apart.worked == 1  # its record was written apart
    assert status_of(batch) == "completed"
    # A closed session's server process ends a moment after its client closed it: polled. (Another
    # test's leftovers, in the baseline, may end meanwhile.)
    wait_for(lambda: _sessions() <= baseline, 10, "the engine's sessions to end")


@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks held by another session")
def test_a_renewal_passes_over_the_records_a_flush_holds(transactional_db, alice, model):
    from batches.engine import dbretry, store

    batch = make_batch(alice.org, [{"model": MODEL, "input": [f"t {i}"]} for i in range(2)], endpoint="/v1/embeddings")
    store.heartbeat("w", {})
    first, second = store.claim(batch.pk, "w", 2)
    locked, release, outcome = threading.Event(), threading.Event(), {}

    def flush_holding_the_first():  # as a flush apart holds its rows while it writes
        with transaction.atomic():
            Record.objects.select_for_update().filter(pk=first.pk).first()
            locked.set()
            release.wait(30)
        connection.close()

    def renew():  # an engine session: OPENRELAY_DB_LOCK_TIMEOUT_S applies
        dbretry.engine_session()
        try:
            outcome["held"] = store.hold("w", [batch.pk], lease_s=600)
        except Exception as exc:  # noqa: BLE001 - the test reports it
            outcome["error"] = exc
        finally:
            connection.close()

    holder = threading.Thread(target=flush_holding_the_first)
    holder.start()
    locked.wait(10)
    renewal = threading.Thread(target=renew)
    renewal.start()
    renewal.join(30)
    release.set()
    holder.join(10)
    assert outcome == {"held": True}
    leases = dict(Record.objects.filter(batch=batch).values_list("pk", "lease_expires_at"))
    assert leases[second.pk] > leases[first.pk]  # the free one renewed, the held one passed over
