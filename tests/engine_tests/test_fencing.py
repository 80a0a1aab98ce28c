"""An engine that loses the database stops calling the model; a paused one is fenced; a host lost
mid-trip freezes no batch (issue 54). The parts, in one process: batches.engine.leases,
liveness's stale heartbeat, the fencing token, the deadlines of the engine's sessions. The real
clusters (SIGSTOP, a database cut off behind a proxy): test_fencing_clusters.py."""

import asyncio
import threading
import time
from datetime import timedelta

import psycopg
import pytest
from django.conf import settings
from django.db import connection, connections
from django.utils import timezone

from batches.engine import dbretry, fairness, store
from batches.engine.calls.caller import ModelCaller, Upstream
from batches.engine.fairness import Held
from batches.engine.leases import Leases
from batches.models import Batch, Engine, Record
from tests.helpers import answered, chat, make_batch

postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="row locks and server sessions: PostgreSQL's (SQLite has one writer)"
)


def beat_ago(owner, seconds):
    Engine.objects.filter(owner=owner).update(seen_at=timezone.now() - timedelta(seconds=seconds))


def test_a_heartbeat_a_lease_old_is_dead_though_its_lock_and_process_live(alice, model, engines):
    """A stopped process (SIGSTOP) keeps its lock's connection and its pid: issue 54 saw it never fenced."""
    batch = make_batch(alice.org, [chat(f"q{i}") for i in range(3)])
    paused, other = engines("paused"), engines("other")
    store.mark_sent(paused.owner, [r.pk for r in store.claim(batch.pk, paused.owner, 3)])  # its calls went out
    beat_ago(paused.owner, settings.OPENRELAY_LEASE_S * 0.8)
    assert other.reap() == ({}, {})  # slow, within a lease: alive
    beat_ago(paused.owner, settings.OPENRELAY_LEASE_S + 0.5)
    assert other.reap() == ({batch.pk: 3}, {})
    assert not Engine.objects.filter(owner=paused.owner).exists()


def test_a_taken_over_engines_writes_are_refused_before_anyone_claims_its_records(alice, model, engines):
    batch = make_batch(alice.org, [chat(f"q{i}") for i in range(3)])
    paused, survivor = engines("paused"), engines("survivor")
    stale = store.claim(batch.pk, paused.owner, 3)
    assert store.mark_sent(paused.owner, [r.pk for r in stale]) == {r.pk for r in stale}  # its calls went out
    beat_ago(paused.owner, settings.OPENRELAY_LEASE_S + 0.5)
    assert survivor.reap() == ({batch.pk: 3}, {})

    # Thawed, before the survivor claimed anything: its name is on no record any more.
    assert store.flush(batch.pk, paused.owner, [(r, answered(100)) for r in stale]) == 0
    assert store.save_checkpoints(paused.owner, {stale[0].pk: b"x"}) == set()
    assert store.hold(paused.owner, [batch.pk]) is False  # its renewal finds it fenced, renews nothing
    # Set aside for the one live engine (store.designated): no engine's name, so nothing lands but its claim.
    assert set(Record.objects.filter(batch=batch).values_list("status", "lease_owner")) == {
        ("running", store.designated(survivor.owner))
    }
    assert Batch.objects.get(pk=batch.pk).completed_count == 0

    taken = store.claim(batch.pk, survivor.owner, 3)
    assert [r.pk for r in taken] == [r.pk for r in stale] and all(r.resumed for r in taken)
    assert store.flush(batch.pk, survivor.owner, [(r, answered(7)) for r in taken]) == 3
    assert Batch.objects.get(pk=batch.pk).input_tokens == 21  # billed once, the survivor's


def test_leases_hold_for_half_a_lease_after_the_last_renewal_that_landed(alice, model, engines):
    batch = make_batch(alice.org, [chat(f"q{i}") for i in range(2)])
    owner = engines("keeper").owner
    now = [1000.0]
    leases = Leases(owner, 4, clock=lambda: now[0])
    store.claim(batch.pk, owner, 2, lease_s=4)
    leases.batch_pks = [batch.pk]

    def expiry():
        return max(Record.objects.filter(batch=batch).values_list("lease_expires_at", flat=True))

    leases.renew()
    assert leases.live()
    renewed = expiry()
    assert renewed > timezone.now() + timedelta(seconds=3)
    now[0] += 1.9
    assert leases.live()
    now[0] += 0.2  # half a lease since the renewal that landed was sent
    assert not leases.live()

    leases.loop_seen = now[0]
    leases.renew()
    assert leases.live()
    renewed = expiry()

    now[0] += 2.5  # the loop stopped turning: no renewal, the leases run out
    leases.renew()
    assert not leases.live() and expiry() == renewed

    Engine.objects.filter(owner=owner).delete()  # another engine fenced it
    leases.loop_seen = now[0]
    leases.renew()
    assert leases.fenced and not leases.live()


def test_the_renewing_thread_keeps_a_live_engines_heartbeat_while_its_database_thread_is_busy(alice, model, engines):
    """A slow trip no longer starves the renewals: a heartbeat a lease old would be taken for dead now."""
    batch = make_batch(alice.org, [chat("q")])
    owner = engines("busy").owner
    store.claim(batch.pk, owner, 1, lease_s=2)
    beat_ago(owner, 60)
    leases = Leases(owner, 2)
    leases.batch_pks = [batch.pk]
    leases.start()
    try:
        deadline = time.monotonic() + 10
        while Engine.objects.get(owner=owner).seen_at < timezone.now() - timedelta(seconds=1):
            assert time.monotonic() < deadline, "no renewal landed"
            leases.loop_seen = time.monotonic()
            time.sleep(0.05)
        assert leases.live()
        assert Record.objects.get(batch=batch).lease_expires_at > timezone.now() + timedelta(seconds=1)
    finally:
        leases.stop()


def test_a_call_is_not_sent_while_the_leases_are_in_doubt(sim):
    leased = [True]

    async def go():
        upstream = Upstream(sim.base_url, "m", "", 4)
        async with ModelCaller([upstream], time_limit_s=60, retries=0, leased=lambda: leased[0]) as caller:
            first = await caller.call("/v1/chat/completions", chat("sent"))
            leased[0] = False
            with pytest.raises(Held):
                await caller.call("/v1/chat/completions", chat("held"))
            return first

    assert asyncio.run(go()).status_code == 200
    assert [r["body"]["messages"][0]["content"] for r in sim.requests("/v1/chat/completions")] == ["sent"]


def test_a_call_is_not_sent_when_the_leases_fall_into_doubt_while_its_mark_is_written(sim):
    """The first call waits for its sent mark on the engine's database thread (trips.SentMarks), which a
    slow trip or a stopped process (SIGSTOP) can hold for seconds: the leases are checked again after it.
    Measured across hosts: a host thawed after 3 leases sent 2 calls its take-over had sent already."""
    leased = [True]

    async def mark():
        leased[0] = False  # the renewals stopped landing while the mark waited

    async def go():
        upstream = Upstream(sim.base_url, "m", "", 4)
        async with ModelCaller([upstream], time_limit_s=60, retries=0, leased=lambda: leased[0]) as caller:
            fairness.first_send.set(mark)
            with pytest.raises(Held):
                await caller.call("/v1/chat/completions", chat("held"))

    asyncio.run(go())
    assert sim.requests("/v1/chat/completions") == []


def test_a_call_is_not_sent_when_the_leases_fall_into_doubt_while_its_connection_opens(sim):
    """The last wait before the request's bytes leave is a new connection's: checked after it too."""
    leased = [True]

    async def go():
        upstream = Upstream(sim.base_url, "m", "", 4)
        connect = upstream.origin._connect

        async def slow_connect():
            opened = await connect()
            leased[0] = False  # stopped (SIGSTOP) while the TCP handshake went on, thawed a lease later
            return opened

        upstream.origin._connect = slow_connect
        async with ModelCaller([upstream], time_limit_s=60, retries=0, leased=lambda: leased[0]) as caller:
            with pytest.raises(Held):
                await caller.call("/v1/chat/completions", chat("held"))
            leased[0] = True
            return await caller.call("/v1/chat/completions", chat("sent"))  # the connection opened is used

    assert asyncio.run(go()).status_code == 200
    assert [r["body"]["messages"][0]["content"] for r in sim.requests("/v1/chat/completions")] == ["sent"]


# --- the database's clock -------------------------------------------------------------------


@postgresql_only
def test_every_connection_has_a_clock_and_the_engines_sessions_the_servers_too(db):
    params = connection.get_connection_params()
    assert params["connect_timeout"] == settings.OPENRELAY_DB_CONNECT_TIMEOUT_S
    assert (params["keepalives"], params["keepalives_idle"], params["keepalives_count"]) == (
        1,
        settings.OPENRELAY_DB_KEEPALIVE_IDLE_S,
        settings.OPENRELAY_DB_KEEPALIVE_COUNT,
    )
    assert params["tcp_user_timeout"] == settings.OPENRELAY_DB_TCP_USER_TIMEOUT_S * 1000

    def show():
        with connection.cursor() as cursor:
            cursor.execute("SHOW idle_in_transaction_session_timeout")
            idle = cursor.fetchone()[0]
            cursor.execute("SHOW lock_timeout")
            return idle, cursor.fetchone()[0]

    seen = {}

    def engine_thread():
        dbretry.engine_session()
        try:
            seen["engine"] = show()
        finally:
            connections.close_all()

    thread = threading.Thread(target=engine_thread)
    thread.start()
    thread.join()
    assert seen["engine"] == ("10s", "5s")
    assert show() == ("0", "0")  # the web's and the tests' own: no server-side limits imposed on them


@postgresql_only
def test_a_host_lost_holding_a_trips_transaction_does_not_freeze_the_batch(alice, model, engines, settings):
    """Issue 54: a host whose link went down inside a trip held the batch row until the server
    noticed, 163 s; every other host's flushes of that batch waited behind it."""
    settings.OPENRELAY_DB_IDLE_IN_TRANSACTION_S = 1.0
    settings.OPENRELAY_DB_LOCK_TIMEOUT_S = 0.5
    batch = make_batch(alice.org, [chat(f"q{i}") for i in range(4)])
    lost, other = engines("lost"), engines("other")
    store.claim(batch.pk, lost.owner, 2)
    mine = store.claim(batch.pk, other.owner, 2)

    # The lost host's trip: its engine session, a transaction that locked the batch row and
    # its records, and then no word more (its link is down: the server waits for it).
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    vanished = psycopg.connect(**params, autocommit=True)
    try:
        vanished.execute(dbretry.deadlines())
        vanished.execute("BEGIN")
        vanished.execute(
            "SELECT id FROM batches_record WHERE batch_id = %s AND lease_owner = %s FOR UPDATE", [batch.pk, lost.owner]
        )
        vanished.execute("SELECT id FROM batches_batch WHERE id = %s FOR UPDATE", [batch.pk])

        result = {}

        def other_trip():
            dbretry.engine_session()
            try:
                started = time.monotonic()
                done = answered(5)
                result["written"] = dbretry.call(
                    store.trip,
                    other.owner,
                    {batch.pk: [(r, done) for r in mine]},
                    {batch.pk: (2, 0, 2)},
                    timezone.now() + timedelta(seconds=10),
                )[0]
                result["took"] = time.monotonic() - started
            finally:
                connections.close_all()

        thread = threading.Thread(target=other_trip)
        thread.start()
        thread.join(30)
        assert not thread.is_alive(), "the other engine's trip is frozen behind the lost host's transaction"
    finally:
        vanished.close()
    assert result["written"] == {batch.pk: 2}
    assert result["took"] < 5, result
    assert Batch.objects.get(pk=batch.pk).completed_count == 2
