"""The gateway's CPU a record (issue 55 item 4): what the record path and the engine's clocks
spend, and that each saving reads and writes what it did before.

A record is marked sent on its row before its first call goes out (trips.SentMarks), one
statement a turn of the loop. A trip marks the next records of each queue ahead of their
start in its own transaction (trips.Trips.ahead), so most records need no statement of their
own; the mark stays conditional on the lease, and what a take-over reads is unchanged. The
statements an engine runs on a clock (the batches' poll, the heartbeat) skip the ORM's
queryset construction.
"""

import asyncio
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.utils import timezone

from batches.engine import prefixes, store, trips
from batches.engine.checkpoints import LeaseLost
from batches.engine.runner import run_batch
from batches.models import Batch, Engine, Record
from tests.helpers import chat, make_batch


def _lease_until():
    return timezone.now() + timedelta(seconds=30)


def test_a_trip_marks_sent_only_the_records_its_engine_holds(alice, model, engines):
    batch = make_batch(alice.org, [chat(f"q{i}") for i in range(9)])
    mine, theirs = engines("mine"), engines("theirs")
    held = store.claim(batch.pk, mine.owner, 4)
    other = store.claim(batch.pk, theirs.owner, 2)
    asked = [held[0].pk, held[1].pk, other[0].pk]
    claims = {batch.pk: (6, held[-1].line, 0)}

    _, claimed, _, marked = store.trip(mine.owner, {}, claims, _lease_until(), sent={batch.pk: (asked, 1)})

    # Not the other engine's record; the first of those claimed now (it starts right after the trip).
    fresh = claimed[batch.pk]
    assert marked == {held[0].pk, held[1].pk, fresh[0].pk} and [r.sent for r in fresh] == [True, False, False]
    assert set(Record.objects.filter(batch=batch, sent=True).values_list("pk", flat=True)) == marked


class _Engine:
    """What SentMarks reaches of an engine: its owner and its database thread, here counted."""

    def __init__(self, owner):
        self.owner = owner
        self.statements = []

    async def db(self, fn, *args):
        self.statements.append(args[1])
        return await asyncio.to_thread(fn, *args)


def test_a_record_marked_ahead_goes_out_without_a_statement_and_the_others_wait_for_theirs(alice, model, engines):
    batch = make_batch(alice.org, [chat(f"q{i}") for i in range(3)])
    mine = engines("mine")
    ahead, own, lost = store.claim(batch.pk, mine.owner, 3)
    *_, marked = store.trip(mine.owner, {}, {}, _lease_until(), sent={batch.pk: ([ahead.pk], 0)})
    ahead.sent = ahead.pk in marked
    Record.objects.filter(pk=lost.pk).update(lease_owner="someone else")  # taken over meanwhile
    engine = _Engine(mine.owner)
    marks = trips.SentMarks(engine)

    async def start():
        await marks.mark(ahead)
        assert engine.statements == []  # marked by the trip: no statement of its own
        await marks.mark(own)
        try:
            await marks.mark(lost)
        except LeaseLost:
            return True
        return False

    assert asyncio.run(start()) is True
    assert engine.statements == [[own.pk], [lost.pk]]
    assert set(Record.objects.filter(batch=batch, sent=True).values_list("pk", flat=True)) == {ahead.pk, own.pk}


def _run(pk, records, started, started_at_trip):
    queue = prefixes.RecordQueue((record, b"") for record in records)
    return SimpleNamespace(pk=pk, queue=queue, started=started, started_at_trip=started_at_trip)


def test_a_trip_takes_the_head_of_each_queue_as_many_as_it_started_since_the_last_trip():
    records = [store.ClaimedRecord(pk, pk, f"c{pk}", 0, 1) for pk in range(1, 9)]
    records[0].sent = True  # marked by the last trip already
    records[2].resumed = True  # a dead engine's: marked by its own statement, in line order with the others
    busy, idle, new = _run(1, records, 10, 7), _run(2, records[4:], 5, 5), _run(3, [], 4, 0)

    ahead = trips.Trips.ahead({1: busy, 2: idle, 3: new})

    # Busy: 3 started since the last trip, its queue's next 3 (not the resumed one). New: 4
    # started and nothing queued, the first 4 its trip claims. Idle: none started, none marked.
    assert {pk: ([r.pk for r in marked], n) for pk, (marked, n) in ahead.items()} == {1: ([2, 4, 5], 0), 3: ([], 4)}
    assert (busy.started_at_trip, idle.started_at_trip, new.started_at_trip) == (10, 5, 4)


def test_a_driven_batch_marks_most_of_its_records_on_its_trips(alice, model, sim, monkeypatch):
    """Measured on a 0 ms model: each record's own mark was a statement a turn of the loop
    (~15% of a worker's busy time). Most ride on the trips now; every record still runs once."""
    own = []
    write = trips.SentMarks._write

    async def counted(self, marks):
        own.extend(marks)
        return await write(self, marks)

    monkeypatch.setattr(trips.SentMarks, "_write", counted)
    batch = make_batch(alice.org, [chat(f"question {i}") for i in range(600)])
    run_batch(batch.pk)
    batch = Batch.objects.get(pk=batch.pk)
    assert (batch.status, batch.completed_count) == ("completed", 600)
    assert len(sim.bodies("/v1/chat/completions")) == 600
    assert len(set(own)) == len(own)  # a record marked ahead is never marked again
    # Every record, before; 208-254 of 600 measured (the first claim's, and records claimed and
    # started within one trip while the batch speeds up or ends, go by their own).
    assert len(own) < 400, f"{len(own)} of 600 records were marked by a statement of their own"


def test_the_batches_poll_compiled_once_reads_what_the_queryset_reads(alice, model, transactional_db):
    """store.active_batches runs its statement compiled once a connection (CompiledValues): the
    rows, their types (dates, decimals, JSON) and the `only` filter are the queryset's own."""
    batches = [make_batch(alice.org, [chat(f"q{i}")]) for i in range(3)]
    Batch.objects.filter(pk=batches[0].pk).update(status="in_progress", output_contract={"type": "object"})
    Batch.objects.filter(pk=batches[2].pk).update(status="completed")
    expected = sorted(store._active_batches_query(), key=lambda row: row["pk"])

    for _ in range(2):  # compiled at the first call, reused at the second
        assert sorted(store.active_batches(), key=lambda row: row["pk"]) == expected
    assert [row["pk"] for row in expected] == [batches[0].pk, batches[1].pk]
    assert expected[0]["output_contract"] == {"type": "object"} and expected[0]["created_at"].tzinfo is not None
    assert store.active_batches(only=[batches[1].pk]) == [expected[1]]


def test_a_beat_writes_its_row_drops_the_long_dead_and_reads_the_live_as_the_orm_did(engines):
    mine, other = engines("mine"), engines("other")
    Engine.objects.filter(owner=other.owner).update(calls={"3": [1, 2, 0]})
    now = timezone.now()
    Engine.objects.create(owner="long dead", seen_at=now - timedelta(seconds=1000))
    Engine.objects.create(owner="a lease old", seen_at=now - timedelta(seconds=15))

    live = store.heartbeat(mine.owner, {"7": 5}, host="h", pid=42, lease_s=10, first=False)

    assert live == [(mine.owner, {"7": 5}, {}), (other.owner, {}, {"3": [1, 2, 0]})]
    assert set(Engine.objects.values_list("owner", flat=True)) == {mine.owner, other.owner, "a lease old"}
    assert Engine.objects.filter(owner=mine.owner, host="h", pid=42, seen_at__gte=now).exists()
    with pytest.raises(store.Fenced):
        store.heartbeat("gone", {}, first=False)
