"""A dead engine is found within a second or two and its records are taken over; a live one,
however slow, never is, and one taken for dead cannot write (batches.engine.liveness)."""

import os
import subprocess
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from batches.engine import store
from batches.models import Batch, Engine, Record
from openrelay.simulator.config import SimulatorConfig
from openrelay.simulator.server import run_in_thread
from tests.helpers import answered, assert_exactly_once, chat, make_batch, status_of, wait_for


def a_dead_pid():
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def kill(engine):
    """What kill -9 leaves: on PostgreSQL its lock's connection closed by the kernel; elsewhere a
    process that is gone and a heartbeat that stops (two beats missed)."""
    if connection.vendor == "postgresql":
        engine.close()
    else:
        Engine.objects.filter(owner=engine.owner).update(pid=a_dead_pid())
    Engine.objects.filter(owner=engine.owner).update(seen_at=timezone.now() - timedelta(seconds=2))


def test_it_never_takes_a_slow_live_engine_for_dead(alice, model, engines):
    batch = make_batch(alice.org, [chat(f"q{i}") for i in range(3)])
    slow, other = engines("slow"), engines("other")
    store.claim(batch.pk, slow.owner, 3)
    # Most of a lease without a heartbeat: its process (SQLite) or its lock (PostgreSQL) still answers
    # for it. (A lease without one is dead however it answers: test_fencing.py.)
    Engine.objects.filter(owner=slow.owner).update(seen_at=timezone.now() - timedelta(seconds=8))
    assert other.reap() == ({}, {})
    assert Engine.objects.filter(owner=slow.owner).exists()
    assert store.claim(batch.pk, other.owner, 3) == []


def test_it_fences_an_engine_taken_for_dead(alice, model, engines):
    batch = make_batch(alice.org, [chat(f"q{i}") for i in range(3)])
    dead, survivor = engines("dead"), engines("survivor")
    stale = store.claim(batch.pk, dead.owner, 3)
    kill(dead)

    assert survivor.reap() == ({batch.pk: 3}, {})
    assert not Engine.objects.filter(owner=dead.owner).exists()  # its shares go to the living at once
    taken = store.claim(batch.pk, survivor.owner, 3)
    assert [r.pk for r in taken] == [r.pk for r in stale] and all(r.resumed for r in taken)

    # The "dead" engine was only slow: nothing it writes lands, and its next beat finds it fenced.
    assert store.flush(batch.pk, dead.owner, [(r, answered(100)) for r in stale]) == 0
    assert store.save_checkpoints(dead.owner, {stale[0].pk: b"x"}) == set()
    with pytest.raises(store.Fenced):
        store.heartbeat(dead.owner, {}, first=False)
    assert store.flush(batch.pk, survivor.owner, [(r, answered(7)) for r in taken]) == 3
    batch = Batch.objects.get(pk=batch.pk)
    assert (batch.completed_count, batch.input_tokens) == (3, 21)  # the survivor's run, once
    assert set(Record.objects.filter(batch=batch).values_list("attempts", flat=True)) == {2}


def test_a_fenced_engine_is_reaped_once(alice, model, engines):
    batch = make_batch(alice.org, [chat(f"q{i}") for i in range(2)])
    dead, first, second = engines("dead"), engines("first"), engines("second")
    store.claim(batch.pk, dead.owner, 2)
    kill(dead)
    Engine.objects.filter(owner=dead.owner).update(holding={"7": 5, "8": 0})
    assert first.reap() == ({batch.pk: 2}, {7: 5})  # its records, and the calls it held to absorb
    assert second.reap() == ({}, {})  # compare-and-set on its row: one engine takes it over


# --- real clusters ------------------------------------------------------------------------------


def engines_of(cluster):
    """The owners of the engines running in `cluster`'s processes."""
    owners = []
    for owner, pid in Engine.objects.values_list("owner", "pid"):
        try:
            if os.getpgid(pid) == cluster.process.pid:
                owners.append(owner)
        except ProcessLookupError:
            pass
    return owners


def content_of(custom_id):
    return f"q{int(custom_id.removeprefix('req-')) - 1}"


@pytest.mark.slow
def test_kill_9_of_one_of_two_clusters_sends_its_calls_again_within_seconds(alice, model, clusters):
    """The issue's measurement: 3 s calls, two clusters, kill -9 of one: its calls in flight were
    sent again only after up to 22.8 s (the lease, then the survivor's share)."""
    with run_in_thread(SimulatorConfig(latency_ms=3000)) as slow:
        model.deployments.update(base_url=slow.base_url, max_concurrency=8)
        first, _ = clusters(OPENRELAY_Q_WORKERS=1), clusters(OPENRELAY_Q_WORKERS=1)
        wait_for(lambda: Engine.objects.count() == 2, 60, "both engines")
        dead = engines_of(first)
        assert len(dead) == 1
        batch = make_batch(alice.org, [chat(f"q{i}") for i in range(48)])

        def sent(owners):
            leased = Record.objects.filter(batch=batch, status="running", lease_owner__in=owners)
            contents = {r["body"]["messages"][0]["content"] for r in slow.requests()}
            return {cid for cid in leased.values_list("custom_id", flat=True) if content_of(cid) in contents}

        wait_for(lambda: sent(dead), 60, "the first cluster's calls in flight")
        in_flight = sent(dead)
        first.kill()
        killed_at = time.monotonic()
        done_at_kill = set(Record.objects.filter(batch=batch, status="succeeded").values_list("custom_id", flat=True))
        in_flight -= done_at_kill  # written in the moment before the kill
        assert in_flight, "the dead engine had nothing in flight; the test proves nothing"
        wait_for(lambda: status_of(batch) == "completed", 120, "the batch to complete")

    calls = {}
    for request in slow.requests():
        calls.setdefault(request["body"]["messages"][0]["content"], []).append(request["at"])
    resent_after = [min(at for at in calls[content_of(cid)] if at > killed_at) - killed_at for cid in in_flight]
    print(f"kill -9 -> {len(in_flight)} calls in flight sent again after {sorted(round(s, 2) for s in resent_after)} s")
    # Goal 3 s (PostgreSQL) / 5 s (SQLite); a margin for a loaded machine, well under the lease's 10-23 s.
    assert max(resent_after) < 8, resent_after
    assert all(len(calls[content_of(cid)]) == 1 for cid in done_at_kill), "a finished record ran again"
    assert_exactly_once(batch, 48)
