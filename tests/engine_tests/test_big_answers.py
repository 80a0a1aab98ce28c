"""Large legitimate answers (issue 42, finding 3), at small scale: an engine holds at most its byte
budget of answers (a big one waits for room, reading paused), flushes are split by bytes, a record
whose result the database refuses fails alone, and another organization's batch goes on meanwhile.

Full size (16 embeddings answers of ~130 MB under the default budget) is tests/perf's bench row.
"""

import asyncio
import logging
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.utils import timezone

from batches.engine import cut, store
from batches.engine.calls import budget
from batches.engine.calls.usage import Usage
from batches.engine.outcomes import RecordOutcome
from batches.models import Batch, Record
from batches.services import cancel_batch
from openrelay.simulator.config import SimulatorConfig
from openrelay.simulator.server import run_in_thread
from tests.engine_tests.test_answer_memory import _kb, _workers  # a worker's RSS and peak, read the same way
from tests.helpers import MODEL, chat, make_batch, read_lines, sessions_where, status_of, wait_for

pytestmark = pytest.mark.usefixtures("tmp_storage")  # stored files in tmp_path (tests/fixtures/storage.py)

MB = 1024 * 1024
EMBEDDINGS = "/v1/embeddings"
INPUTS, DIMENSIONS = 128, 2048  # the simulator's answer: ~5.6 MB of JSON floats


def embeddings(i):
    return {"model": MODEL, "input": [f"text {i} {n}" for n in range(INPUTS)], "dimensions": DIMENSIONS}


@pytest.mark.slow
def test_big_answers_finish_within_the_engines_budget_and_another_org_goes_on(model, alice, bob, clusters):
    # One engine, 16 call slots: every answer could be in memory at once (the old code held them all).
    cluster = clusters(
        OPENRELAY_Q_WORKERS=1, OPENRELAY_ENGINE_ANSWER_BUDGET_BYTES=12 * MB, OPENRELAY_FLUSH_MAX_BYTES=1024
    )
    warm = make_batch(alice.org, [chat("warm")])
    wait_for(lambda: status_of(warm) == "completed", 60, "the warm-up batch")
    before = {pid: _kb(pid, "VmRSS") for pid in _workers(cluster)}

    big = make_batch(alice.org, [embeddings(i) for i in range(16)], endpoint=EMBEDDINGS)
    started = time.monotonic()
    small = make_batch(bob.org, [chat(f"q {i}") for i in range(20)])
    wait_for(lambda: status_of(small) == "completed", 60, "bob's batch")
    small_s = time.monotonic() - started
    wait_for(lambda: status_of(big) == "completed", 180, "the big answers' batch")

    grown_mb = max(_kb(pid, "VmHWM") - rss for pid, rss in before.items()) / 1024
    big.refresh_from_db()
    assert big.completed_count == 16 and big.failed_count == 0
    lines = read_lines(big.output_file)
    assert len(lines) == 16
    data = lines[0]["response"]["body"]["data"]
    assert len(data) == INPUTS and len(data[0]["embedding"]) == DIMENSIONS
    # 16 answers of 5.6 MB, 16 call slots: the worker grew 701 MB before the budget (every answer
    # held at once, parsed, then the close fetched every result at once), 137 MB with it.
    assert grown_mb < 300, f"the worker grew {grown_mb:.0f} MB"
    assert small_s < 30, f"bob's 20 records took {small_s:.1f} s"
    cluster.terminate()
    log = Path(cluster.log.name).read_text()
    assert "split into" in log  # OPENRELAY_FLUSH_MAX_BYTES=1024: every flush of two records or more
    assert "waited for room in the answer budget" in log


def _claimed(batch, owner="w"):
    return store.claim(batch.pk, owner, 10)


def test_a_flush_is_split_by_bytes_and_writes_every_record(alice, model, settings, caplog):
    settings.OPENRELAY_FLUSH_MAX_BYTES = 2048
    batch = make_batch(alice.org, [chat(f"q {i}") for i in range(5)])
    claimed = _claimed(batch)
    body = {"text": "x" * 1500}
    with caplog.at_level(logging.INFO, logger="openrelay.engine"):
        written = store.flush(
            batch.pk, "w", [(r, RecordOutcome(True, 200, "req", body, usage=Usage(3, 0, 2, 0))) for r in claimed]
        )
    assert written == 5
    assert "flush of 5 records split into 5 statements" in caplog.text
    batch.refresh_from_db()
    assert (batch.completed_count, batch.input_tokens, batch.output_tokens) == (5, 15, 10)
    assert Record.objects.filter(batch=batch, status="succeeded", response_body__contains="x" * 1500).count() == 5


def test_a_record_whose_result_the_database_refuses_fails_alone(alice, model, caplog):
    batch = make_batch(alice.org, [chat(f"q {i}") for i in range(4)])
    claimed = _claimed(batch)
    good = RecordOutcome(True, 200, "req", {"ok": True}, usage=Usage(3, 0, 2, 0))
    # Usage past a 64-bit column: both databases refuse it (PostgreSQL bigint, SQLite INTEGER).
    breaking = RecordOutcome(True, 200, "req", {"ok": True}, usage=Usage(2**64, 0, 2, 0))
    outcomes = [(r, breaking if r.line == 2 else good) for r in claimed]
    with caplog.at_level(logging.ERROR, logger="openrelay.engine"):
        assert store.flush(batch.pk, "w", outcomes) == 4
    assert "could not be stored" in caplog.text
    records = {r.line: r for r in Record.objects.filter(batch=batch)}
    assert {line: r.status for line, r in records.items()} == {
        1: "succeeded",
        2: "failed",
        3: "succeeded",
        4: "succeeded",
    }
    assert records[2].error_code == "result_not_stored" and records[2].prompt_tokens == 0
    assert records[2].response_body == ""
    batch = Batch.objects.get(pk=batch.pk)
    assert (batch.completed_count, batch.failed_count, batch.input_tokens) == (3, 1, 9)


def _waiting_for_locks():
    return sessions_where("wait_event_type = 'Lock'")


def _in_thread(errors, fn, *args):
    def run():
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 - the test reports it
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_flushes_in_opposite_orders_and_a_cancel_never_deadlock(transactional_db, alice, model):
    if connection.vendor != "postgresql":
        pytest.skip("SQLite runs one writer at a time: there are no row locks to order")
    x = make_batch(alice.org, [chat(f"x {i}") for i in range(4)])
    y = make_batch(alice.org, [chat(f"y {i}") for i in range(4)])
    Batch.objects.filter(pk__in=[x.pk, y.pk]).update(status="in_progress")
    ok = RecordOutcome(True, 200, "req", {"ok": True}, usage=Usage(3, 0, 2, 0))
    x1, y1 = store.claim(x.pk, "w1", 1)[0], store.claim(y.pk, "w1", 1)[0]
    x2, y2 = store.claim(x.pk, "w2", 1)[0], store.claim(y.pk, "w2", 1)[0]
    # w1 stalled past its lease on x1: w2's next claim looks for expired records and takes it.
    Record.objects.filter(pk=x1.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=5))
    lease = timezone.now() + timedelta(seconds=30)
    errors = []
    # Another transaction holds batch x while the three queue up behind it, in the order that
    # deadlocked: w1's flush first (it gets x next), then w2's claim-and-flush, then a cancel.
    with transaction.atomic():
        list(Batch.objects.select_for_update().filter(pk=x.pk).values_list("pk"))
        threads = [_in_thread(errors, store.trip, "w1", {y.pk: [(y1, ok)], x.pk: [(x1, ok)]}, {}, lease)]
        wait_for(lambda: errors or _waiting_for_locks() >= 1, 30, "w1 flush to wait for batch x")
        assert not errors, errors
        w2 = ({x.pk: [(x2, ok)], y.pk: [(y2, ok)]}, {x.pk: (2, 0, 2)}, lease)
        threads.append(_in_thread(errors, store.trip, "w2", *w2))
        wait_for(lambda: errors or _waiting_for_locks() >= 2, 30, "w2 trip to wait")
        assert not errors, errors

        def cancel():
            cancel_batch(Batch.objects.get(pk=x.pk))
            cut.close_unfinished(x.pk, "cancelled", "batch_cancelled", "cancelled")

        threads.append(_in_thread(errors, cancel))
        wait_for(lambda: errors or _waiting_for_locks() >= 3, 30, "the cancel to wait")
        assert not errors, errors
    for thread in threads:
        thread.join(60)
    assert not errors, errors  # before the lock order: "deadlock detected" in one of the flushes
    statuses = dict(Record.objects.filter(batch=x).values_list("pk", "status"))
    assert statuses[x1.pk] == statuses[x2.pk] == "succeeded"
    assert sorted(statuses.values()).count("cancelled") == 2
    x.refresh_from_db()
    assert (x.status, x.completed_count, x.failed_count) == ("cancelling", 2, 2)
    assert Record.objects.filter(batch=y, status="succeeded").count() == 2


def test_the_budget_queues_big_answers_in_order_and_lets_one_too_big_go_alone():
    answers = budget.Budget(10 * MB)
    granted = []
    first, second = budget.Holding(answers), budget.Holding(answers)
    assert first.take(6 * MB, lambda: granted.append("unused")) is None
    waiting = second.take(6 * MB, lambda: granted.append("second"))
    assert waiting is not None and answers.waiting
    too_big = budget.Holding(answers)
    too_big.take(30 * MB, lambda: granted.append("too big"))
    first.release()  # flushed: the second fits now; the too-big one waits for an empty budget
    assert granted == ["second"] and answers.held == 6 * MB
    second.release()
    assert granted == ["second", "too big"] and answers.held == 30 * MB
    too_big.release()
    cancelled = budget.Holding(answers)
    answers.force(8 * MB)
    token = cancelled.take(4 * MB, lambda: granted.append("cancelled"))
    answers.cancel(token)  # its connection failed while it waited
    answers.give_back(8 * MB)
    assert granted == ["second", "too big"] and answers.held == 0 and not answers.waiting


@pytest.mark.slow
@pytest.mark.skipif(connection.vendor != "postgresql", reason="a row lock held on one batch: SQLite has one writer")
def test_another_orgs_batch_flows_while_a_big_flush_cannot_land(transactional_db, model, alice, bob, clusters):
    """Issue 55, finding 6: a big flush held the engine's one database thread for seconds (bench row
    15: 134 MB answers, bob's 20 records 68.6 s). Here a flush that cannot land at all stands in for a
    slow one: alice's batch row is locked from outside while her big answers are on their way.
    Answers over OPENRELAY_FLUSH_APART_BYTES are written on a thread and connection of their own,
    so bob's records are claimed, called and written meanwhile."""
    with run_in_thread(SimulatorConfig(latency_ms=3000)) as slow:
        model.deployments.update(base_url=slow.base_url)
        cluster = clusters(OPENRELAY_Q_WORKERS=1, OPENRELAY_FLUSH_APART_BYTES=MB, OPENRELAY_DB_LOCK_TIMEOUT_S=2)
        big = make_batch(alice.org, [embeddings(i) for i in range(4)], endpoint=EMBEDDINGS)
        wait_for(lambda: Record.objects.filter(batch=big, status="running").count() == 4, 60, "alice's calls")
        release, locked, errors = threading.Event(), threading.Event(), []

        def hold_alices_row():
            with transaction.atomic():
                list(Batch.objects.select_for_update().filter(pk=big.pk).values_list("pk"))
                locked.set()
                release.wait(120)

        holder = _in_thread(errors, hold_alices_row)
        try:
            assert locked.wait(30), errors
            wait_for(lambda: _waiting_for_locks() >= 1, 60, "alice's flush to wait for her batch row")
            small = make_batch(bob.org, [chat(f"q {i}") for i in range(20)])
            # Before: bob's records waited as long as alice's row was held (the trip that would
            # claim them was the one waiting for the row).
            waiting = lambda: f"bob's batch while alice's flush waits; the log ends:\n{cluster.log_tail()}"  # noqa: E731
            wait_for(lambda: status_of(small) == "completed", 45, waiting)
            assert Record.objects.filter(batch=big, status="succeeded").count() == 0
        finally:
            release.set()
            holder.join(60)
        assert not errors, errors
        wait_for(lambda: status_of(big) == "completed", 120, "alice's batch once her row is free")
    big.refresh_from_db()
    assert (big.completed_count, big.failed_count) == (4, 0)
    assert len(read_lines(big.output_file)) == 4


def test_an_answer_waiting_for_room_gives_its_slot_to_another_orgs_call():
    """Issue 55, bench row 15: a call whose big answer waited for room in the answer budget (room
    that comes back only when a big flush lands, a minute on a loaded machine) kept its slot at
    the deployment all along, and flow control took the wait for the server's latency; another
    organization's small calls waited behind it. Driven with one slot: alice's first answer fills
    the budget (not flushed), her second waits for room, and bob's call must get the slot."""
    from batches.engine.calls.caller import ModelCaller, Upstream
    from batches.engine.fairness import Ticket

    big = {"model": MODEL, "input": [f"text {n}" for n in range(INPUTS)], "dimensions": DIMENSIONS}
    answers = budget.Budget(8 * MB)  # one ~5.6 MB answer fits, two don't
    alice, bob = Ticket(1, organization_id=1), Ticket(2, organization_id=2)

    async def held_call(caller, ticket, body, endpoint, holding):
        budget.current.set(holding)  # the record's (its own task's context), as lanes.Lanes._slot sets it
        return await caller.call(endpoint, body, ticket)

    async def scenario(base_url):
        upstream = Upstream(base_url, MODEL, "", 1)
        async with ModelCaller([upstream], time_limit_s=60, retries=0) as caller:
            first, second = budget.Holding(answers), budget.Holding(answers)
            assert (await held_call(caller, alice, big, EMBEDDINGS, first)).ok
            waiting = asyncio.create_task(held_call(caller, alice, big, EMBEDDINGS, second))
            deadline = time.monotonic() + 30
            while not answers.waiting:
                assert time.monotonic() < deadline and not waiting.done(), "alice's second answer never waited"
                await asyncio.sleep(0.01)
            small = asyncio.create_task(
                held_call(caller, bob, chat("q"), "/v1/chat/completions", budget.Holding(answers))
            )
            # Before: bob's call waited for the slot until alice's first answer was flushed.
            done, _ = await asyncio.wait([small], timeout=10)
            assert small in done, "bob's call waited behind an answer waiting for room"
            assert small.result().ok and not waiting.done()
            assert upstream.in_use == 0  # the waiting answer holds no slot; bob's went back
            first.release()  # flushed: alice's second answer is read
            result = await asyncio.wait_for(waiting, 30)
            assert result.ok and len(result.body["data"]) == INPUTS
            assert upstream.in_use == 0 and alice.calls == 0 and bob.calls == 0

    with run_in_thread(SimulatorConfig()) as sim:
        asyncio.run(scenario(sim.base_url))
