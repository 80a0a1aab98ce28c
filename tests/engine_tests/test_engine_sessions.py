"""An engine's database sessions and its lease renewals beside flushes apart (issue 55, item 6):
an engine that stops closes every connection its threads opened, and a renewal passes over the
record rows a flush holds. The answers come from a real HTTP server (one embeddings answer)."""

import asyncio
import random
import socket
import threading

import orjson
import pytest
from django.db import connection, transaction

from batches.engine.runner import Engine
from batches.models import Record
from tests.helpers import MODEL, deploy, make_batch, status_of, wait_for

pytestmark = pytest.mark.usefixtures("tmp_storage")

DIMENSIONS = 3072
# The engine's peak over its idle allocations, at most this many times the answer's bytes.


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


def _sessions():
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")  # else the view stays as first read in a transaction
        # Client sessions only: an autovacuum worker shows the database's name too.
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND backend_type = 'client backend'"
        )
        return cursor.fetchone()[0]


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
