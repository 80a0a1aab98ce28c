"""The ledger: one entry per batch at its terminal transition, exactly once."""

import threading
import time
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection, transaction
from django.utils import timezone
from openai.types.batch_usage import BatchUsage

from batches.engine import finish
from batches.engine.runner import run_batch
from batches.engine.sweeper import sweep
from batches.models import Batch
from billing import ledger
from billing.models import LedgerEntry
from openrelay.core.models import Price
from tests.billing_tests.conftest import LONG, as_usd, create, oracle_cost, usage_of_lines
from tests.helpers import MODEL, chat, read_lines

USAGE = {"input_tokens": 1000, "cached_tokens": 256, "output_tokens": 300, "reasoning_tokens": 12}


def ended_batch(org, status="completed", **fields):
    """A batch row as the engine leaves it at a terminal transition (no records needed)."""
    now = timezone.now()
    values = {
        "price_input": Decimal("0.20"),
        "price_cached_input": Decimal("0.05"),
        "price_output": Decimal("0.80"),
        **USAGE,
        **fields,
    }
    return Batch.objects.create(
        organization=org,
        endpoint="/v1/chat/completions",
        model_name=MODEL,
        input_file_public_id="file-x",
        created_at=now,
        expires_at=now + timedelta(hours=24),
        status=status,
        **values,
    )


def test_it_bills_an_ended_batch_once_and_returns_the_same_entry_again(alice):
    batch = ended_batch(alice.org)
    first = ledger.bill_batch(batch)
    second = ledger.bill_batch(Batch.objects.get(pk=batch.pk))
    assert first.pk == second.pk and LedgerEntry.objects.count() == 1
    entry = LedgerEntry.objects.get()
    assert (entry.organization, entry.batch_id, entry.batch_status, entry.model_name, entry.priority) == (
        alice.org,
        batch.public_id,
        "completed",
        MODEL,
        "standard",
    )
    assert (entry.input_tokens, entry.cached_tokens, entry.output_tokens, entry.reasoning_tokens) == (
        1000,
        256,
        300,
        12,
    )
    assert (entry.price_input, entry.price_cached_input, entry.price_output, entry.price_multiplier) == (
        Decimal("0.20"),
        Decimal("0.05"),
        Decimal("0.80"),
        Decimal("0.5"),
    )
    assert (
        (entry.input_cost_nanos, entry.cached_input_cost_nanos, entry.output_cost_nanos, entry.total_cost_nanos)
        == oracle_cost(1000, 256, 300)
        == (74_400, 6_400, 120_000, 200_800)
    )


def test_it_bills_expedited_batches_at_the_sync_rate(alice):
    entry = ledger.bill_batch(ended_batch(alice.org, priority="expedited", price_multiplier=Decimal("1.0")))
    assert entry.total_cost_nanos == oracle_cost(1000, 256, 300, multiplier=1)[3] == 401_600


def test_it_refuses_to_bill_a_batch_that_has_not_ended(alice):
    batch = ended_batch(alice.org, status="in_progress")
    with pytest.raises(ledger.NotBillable):
        ledger.bill_batch(batch)
    assert not LedgerEntry.objects.exists()


def test_it_bills_the_counters_in_the_database_not_a_stale_instance(alice):
    batch = ended_batch(alice.org, input_tokens=0, cached_tokens=0, output_tokens=0)
    Batch.objects.filter(pk=batch.pk).update(input_tokens=500, output_tokens=70)  # a flush after `batch` was loaded
    entry = ledger.bill_batch(batch)
    assert (entry.input_tokens, entry.output_tokens, entry.total_cost_nanos) == (500, 70, oracle_cost(500, 0, 70)[3])


def _wait_for_lock_wait(deadline_s=10):
    """PostgreSQL: until another backend waits on a lock (the racing INSERT on the unique batch_id)."""
    deadline = time.monotonic() + deadline_s
    with connection.cursor() as cursor:
        while True:
            # Inside a transaction the activity view is a snapshot taken once; drop it each time.
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND query LIKE 'INSERT INTO \"billing_ledgerentry\"%'"
            )
            if cursor.fetchone()[0]:
                return
            assert time.monotonic() < deadline, "the second caller never reached the ledger insert"
            time.sleep(0.02)


def test_it_bills_once_when_a_second_caller_races_in_its_own_transaction(alice, transactional_db):
    batch = ended_batch(alice.org)
    started, entries, errors = threading.Event(), {}, []

    def second_caller():
        try:
            started.set()
            entries["second"] = ledger.bill_batch(Batch.objects.get(pk=batch.pk)).pk
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)
        finally:
            connection.close()

    racer = threading.Thread(target=second_caller)
    with transaction.atomic():
        entries["first"] = ledger.bill_batch(batch).pk
        racer.start()
        assert started.wait(10)
        if connection.vendor == "postgresql":
            # Its INSERT is blocked on our uncommitted row: the real race.
            _wait_for_lock_wait()
    racer.join(30)
    assert not racer.is_alive() and errors == []
    assert entries["first"] == entries["second"] and LedgerEntry.objects.count() == 1


def test_a_double_finalize_bills_once(alice, model):
    batch = create(alice, [chat("one"), chat(LONG)])
    run_batch(batch.pk)  # completes and bills
    batch.refresh_from_db()
    assert batch.status == "completed"
    # A second closer (a late worker, the sweeper) with a stale copy loses the conditional transition.
    stale = Batch.objects.get(pk=batch.pk)
    stale.status = "finalizing"
    assert finish.close(stale, "completed") is False
    assert finish.finalize_if_done(Batch.objects.get(pk=batch.pk)) is False
    assert LedgerEntry.objects.filter(batch_id=batch.public_id).count() == 1


def test_a_crash_mid_finalize_bills_nothing_and_the_retried_close_bills_once(alice, model, monkeypatch):
    batch = create(alice, [chat("one"), chat(LONG), chat("bad [[status:400]]")])
    real_bill = ledger.bill_batch
    crashed = []

    def bill_then_crash_once(batch):
        entry = real_bill(batch)  # the entry is written, the result files are stored...
        if not crashed:
            crashed.append(batch.pk)
            raise RuntimeError("worker died before the commit")
        return entry

    monkeypatch.setattr(ledger, "bill_batch", bill_then_crash_once)
    # The close fails once (rolled back with the transition: no entry, no files); the engine tries it again
    # itself (batch_set.Roster._retry_closes), from the batch left finalizing.
    run_batch(batch.pk)
    batch.refresh_from_db()
    entry = LedgerEntry.objects.get()
    assert crashed and batch.status == "completed" and entry.batch_id == batch.public_id
    assert sweep()["finalized"] == 0
    prompt, cached, completion = usage_of_lines(read_lines(batch.output_file))
    assert (entry.input_tokens, entry.cached_tokens, entry.output_tokens) == (prompt, cached, completion)
    assert entry.total_cost_nanos == oracle_cost(prompt, cached, completion)[3]


def test_the_sweeper_recloses_a_batch_left_finalizing_and_bills_once(alice, model):
    """A close whose engine died mid-way (nothing retries it but the sweeper, after STUCK_FINALIZING)."""
    batch = create(alice, [chat("one"), chat(LONG)])
    run_batch(batch.pk)
    batch.refresh_from_db()
    LedgerEntry.objects.all().delete()
    Batch.objects.filter(pk=batch.pk).update(
        status="finalizing", output_file=None, finalizing_at=timezone.now() - timedelta(minutes=10)
    )
    assert sweep()["finalized"] == 1
    assert sweep()["finalized"] == 0
    batch.refresh_from_db()
    assert batch.status == "completed" and LedgerEntry.objects.get().batch_id == batch.public_id


def test_a_price_change_after_create_does_not_reprice_the_batch(alice, model):
    batch = create(alice, [chat("one"), chat(LONG)])
    Price.objects.filter(model=model).update(
        input_per_mtok=Decimal("9"), cached_input_per_mtok=Decimal("9"), output_per_mtok=Decimal("9")
    )
    run_batch(batch.pk)
    batch.refresh_from_db()
    entry = LedgerEntry.objects.get(batch_id=batch.public_id)
    assert (entry.price_input, entry.price_cached_input, entry.price_output) == (
        Decimal("0.20"),
        Decimal("0.05"),
        Decimal("0.80"),
    )
    prompt, cached, completion = usage_of_lines(read_lines(batch.output_file))
    assert cached > 0
    expected = oracle_cost(prompt, cached, completion)
    assert entry.total_cost_nanos == expected[3]
    body = alice.client.get(f"/v1/batches/{batch.public_id}").json()
    # `usage` is exactly OpenAI's (the SDK's BatchUsage, each nested object too); the cost is OpenRelay's extension.
    assert set(body["usage"]) == set(BatchUsage.model_fields)
    usage = BatchUsage.model_validate(body["usage"])
    assert body["usage"] == usage.model_dump()
    assert (usage.input_tokens, usage.input_tokens_details.cached_tokens, usage.output_tokens) == (
        prompt,
        cached,
        completion,
    )
    shown = body["openrelay"]["cost"]
    assert shown == {
        "currency": "USD",
        "input": as_usd(expected[0]),
        "cached_input": as_usd(expected[1]),
        "output": as_usd(expected[2]),
        "total": as_usd(expected[3]),
    }
    # A batch created after the change is priced at the new rate.
    later = create(alice, [chat("one"), chat(LONG)])
    assert later.price_input == Decimal("9")


def test_an_expedited_batch_bills_twice_a_standard_one(alice, model):
    bodies = [chat("one"), chat(LONG)]
    standard, expedited = create(alice, bodies), create(alice, bodies, priority="expedited")
    for batch in (expedited, standard):
        run_batch(batch.pk)
    entries = {e.priority: e for e in LedgerEntry.objects.all()}
    assert entries["standard"].input_tokens == entries["expedited"].input_tokens > 0
    assert entries["expedited"].price_multiplier == Decimal("1.00")
    assert entries["expedited"].total_cost_nanos == 2 * entries["standard"].total_cost_nanos
