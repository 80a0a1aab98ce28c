"""Sent marks ahead (issue 55, item 4: the gateway's CPU a record).

A record is marked sent on its row before its first call goes out (trips.SentMarks). Each mark
was a statement of its own (one a turn of the loop: ~1 every 10 records of a 0 ms model, a
quarter to a third of the gateway's CPU a record). A record whose start finds it unmarked now
marks, in the same statement, the next records its batch's queue starts here, as many as the
model's calls here start within trips.AHEAD_S, never more waiting marked than the engine's
calls at the model: the marked-ahead start without a statement, and
the records marked and never started stay bounded.
"""

import asyncio
import time

from django.db import connections

from batches.engine import lanes, store, trips
from batches.engine.checkpoints import LeaseLost
from batches.engine.runner import run_batch
from batches.models import Batch, Record
from tests.helpers import chat, make_batch

RECORDS = 600


class _Engine:
    """What SentMarks reaches of an engine: its owner and its database thread, each statement counted."""

    def __init__(self, owner):
        self.owner = owner
        self.statements = []

    async def db(self, fn, *args):
        self.statements.append(sorted(args[1]))

        def call():
            try:
                return fn(*args)
            finally:
                connections.close_all()  # the worker thread's own connection

        return await asyncio.to_thread(call)


class _Gate:
    def __init__(self, capacity, call_s):
        self.capacity = capacity
        self.call_s = call_s


class _Run:
    """The parts of a lanes.BatchRun that SentMarks reads: its queue, its lane's gate."""

    def __init__(self, records, capacity, call_s=None):
        self.pk = records[0].pk
        self.queue = lanes.prefixes.RecordQueue((record, b"") for record in records)
        self.lane = type("Lane", (), {"gate": _Gate(capacity, call_s)})()


def _driven(monkeypatch):
    """Run a RECORDS batch on this process's engine; (statements, {pk: when its mark landed},
    the pks started in order, the most records marked sent and queued never started at once)."""
    statements, landed, started, widest = [], {}, [], [0]
    write, begin = trips.SentMarks._write, lanes.Lanes._begin
    mark_sent = store.mark_sent

    def timed(owner, pks):
        held = mark_sent(owner, pks)
        at = time.monotonic()
        for pk in held:
            landed.setdefault(pk, at)
        never_started = set(landed) - set(started)
        widest[0] = max(widest[0], len(never_started))
        return held

    async def counted(self, marks):
        statements.append((list(marks), [record.pk for records in marks.values() for record in records or ()]))
        return await write(self, marks)

    def begun(self, run):
        work = begin(self, run)
        started.append(work[1].pk)
        return work

    monkeypatch.setattr(store, "mark_sent", timed)
    monkeypatch.setattr(trips.SentMarks, "_write", counted)
    monkeypatch.setattr(lanes.Lanes, "_begin", begun)
    return statements, landed, started, widest


def test_a_driven_batch_marks_most_of_its_records_ahead_in_few_statements(alice, model, sim, monkeypatch):
    """Measured on a 0 ms model (the model fixture: 16 calls): 90-99 statements for 600 records
    on PostgreSQL, 101-114 on SQLite, when each start asked for its own mark (one a turn of the
    loop); 46-55 and 59-74 marking ahead (283-291 of 600 on SQLite), as many as the engine's
    calls bound what waits marked (16 records started and 16 marked ahead a statement at best).
    Every record still runs once."""
    statements, landed, started, _ = _driven(monkeypatch)
    batch = make_batch(alice.org, [chat(f"question {i}") for i in range(RECORDS)])
    run_batch(batch.pk)
    batch = Batch.objects.get(pk=batch.pk)
    assert (batch.status, batch.completed_count) == ("completed", RECORDS)
    assert len(sim.bodies("/v1/chat/completions")) == RECORDS
    assert set(landed) == set(Record.objects.filter(batch=batch).values_list("pk", flat=True))
    ahead = sum(len(marked) for _, marked in statements)
    print(f"{len(statements)} mark statements for {RECORDS} records, {ahead} of them marked ahead")
    assert ahead >= RECORDS // 3, ahead  # none before
    assert len(statements) <= RECORDS // 6, len(statements)  # SQLite's margin on a loaded machine


def test_a_records_call_never_goes_out_before_its_mark_has_landed(alice, model, sim, monkeypatch):
    """The guarantee a take-over and a host cut from the database rely on, marked ahead or not."""
    _, landed, _, _ = _driven(monkeypatch)
    batch = make_batch(alice.org, [chat(f"question {i}") for i in range(RECORDS)])
    run_batch(batch.pk)
    pks = dict(Record.objects.filter(batch=batch).values_list("custom_id", "pk"))
    calls = sim.requests("/v1/chat/completions")
    assert len(calls) == RECORDS
    early = []
    for call in calls:
        content = call["body"]["messages"][0]["content"]
        pk = pks[f"req-{int(content.removeprefix('question ')) + 1}"]
        if pk not in landed or landed[pk] >= call["at"]:
            early.append(content)
    assert early == []


def test_records_marked_ahead_and_never_started_stay_within_the_engines_calls(alice, model, sim, monkeypatch):
    """The bound: at most the engine's calls at the model (16 here) of a batch are marked sent but
    wait unstarted in its queue; a take-over may re-send those with the ones in flight."""
    _, _, _, widest = _driven(monkeypatch)
    batch = make_batch(alice.org, [chat(f"question {i}") for i in range(RECORDS)])
    run_batch(batch.pk)
    print(f"at most {widest[0]} records marked sent and never started")
    assert 0 < widest[0] <= 16, widest[0]


def test_a_start_marks_ahead_what_the_models_calls_start_soon_within_the_engines_calls(alice, model, engines):
    batch = make_batch(alice.org, [chat(f"q{i}") for i in range(40)])
    mine = engines("mine")
    records = store.claim(batch.pk, mine.owner, 40)
    run = _Run(records, capacity=3)
    engine = _Engine(mine.owner)
    marks = trips.SentMarks(engine, ahead_s=0.1)

    async def start(n):
        for _ in range(n):
            record, _ = run.queue.popleft()
            await marks.mark(run, record)

    def never_started():
        queued = {record.pk for record, _ in run.queue}
        return set(Record.objects.filter(batch=batch, sent=True, pk__in=queued).values_list("pk", flat=True))

    asyncio.run(start(2))  # the seconds a call holds its slot not measured yet: each its own
    assert engine.statements == [[r.pk] for r in records[:2]] and never_started() == set()
    assert run.queue.marked == never_started()  # the queue's count of them, read instead of a walk
    run.lane.gate.call_s = 0.05  # 3 calls: 60 a second, 6 in 0.1 s; at most 3 waiting marked
    asyncio.run(start(1))
    assert engine.statements[-1] == [r.pk for r in records[2:6]] and len(never_started()) == 3
    assert run.queue.marked == never_started()
    asyncio.run(start(3))  # marked ahead: no statement
    assert len(engine.statements) == 3 and never_started() == set()
    assert run.queue.marked == never_started()
    asyncio.run(start(1))
    assert engine.statements[-1] == [r.pk for r in records[6:10]]
    run.lane.gate.call_s = 0.5  # 6 a second: fewer than one in 0.1 s, none ahead
    asyncio.run(start(4))
    assert engine.statements[-1] == [records[10].pk] and never_started() == set()
    assert run.queue.marked == never_started()


def test_a_record_marked_ahead_that_another_engine_holds_now_is_not_sent(alice, model, engines):
    """Fenced meanwhile: the mark ahead found the record no longer its engine's; its own mark says LeaseLost."""
    batch = make_batch(alice.org, [chat(f"q{i}") for i in range(3)])
    mine = engines("mine")
    records = store.claim(batch.pk, mine.owner, 3)
    Record.objects.filter(pk=records[1].pk).update(lease_owner="someone else")  # taken over meanwhile
    run = _Run(records, capacity=4, call_s=0.001)
    engine = _Engine(mine.owner)
    marks = trips.SentMarks(engine)

    async def start():
        first, _ = run.queue.popleft()
        await marks.mark(run, first)  # marks the others ahead: the second is not held, so not marked
        lost, _ = run.queue.popleft()
        try:
            await marks.mark(run, lost)
        except LeaseLost:
            return True
        return False

    assert asyncio.run(start()) is True
    assert engine.statements == [[r.pk for r in records], [records[1].pk]]
    assert run.queue.marked == {records[2].pk}  # the one not marked left the count as it landed
    marked = set(Record.objects.filter(batch=batch, sent=True).values_list("pk", flat=True))
    assert marked == {records[0].pk, records[2].pk}


def test_a_batch_of_slow_calls_marks_none_ahead(alice, model, engines):
    """3 s calls, 8 calls: ~3 starts a second, a slot round's starts together. Each start's own
    statement, as before: a take-over's sent records are then exactly those whose call went out."""
    batch = make_batch(alice.org, [chat(f"q{i}") for i in range(16)])
    mine = engines("mine")
    records = store.claim(batch.pk, mine.owner, 16)
    run = _Run(records, capacity=8, call_s=3.0)
    engine = _Engine(mine.owner)
    marks = trips.SentMarks(engine)

    async def rounds():
        for _ in range(16):
            record, _ = run.queue.popleft()
            await marks.mark(run, record)

    asyncio.run(rounds())
    assert engine.statements == [[r.pk] for r in records]
