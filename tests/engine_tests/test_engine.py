import threading
import time

import pytest

from batches.engine import store
from batches.engine.calls.health import NEUTRAL_REQUEST
from batches.engine.runner import run_batch
from batches.engine.sweeper import sweep
from batches.models import Batch, Record, RecordStatus
from openrelay.core.models import Deployment
from openrelay.simulator.config import SimulatorConfig
from openrelay.simulator.server import run_in_thread
from tests.helpers import chat, make_batch, read_lines


def _finished(batch):
    batch.refresh_from_db()
    return batch


def test_it_runs_a_batch_to_completed_in_openai_shapes(alice, model, sim):
    batch = make_batch(alice.org, [chat(f"question {i}") for i in range(30)])
    run_batch(batch.pk)
    batch = _finished(batch)
    assert batch.status == "completed"
    assert (batch.completed_count, batch.failed_count) == (30, 0)
    assert batch.in_progress_at and batch.finalizing_at and batch.completed_at
    assert batch.error_file is None
    lines = read_lines(batch.output_file)
    assert [line["custom_id"] for line in lines] == [f"req-{i}" for i in range(1, 31)]
    first = lines[0]
    assert set(first) == {"id", "custom_id", "response", "error"}
    assert first["id"].startswith("batch_req_") and first["error"] is None
    assert first["response"]["status_code"] == 200
    assert first["response"]["request_id"]
    assert first["response"]["body"]["object"] == "chat.completion"
    assert batch.output_file.purpose == "batch_output"
    assert batch.output_file.filename == f"{batch.public_id}_output.jsonl"
    # usage rolled up from the lines
    assert batch.input_tokens == sum(line["response"]["body"]["usage"]["prompt_tokens"] for line in lines)
    assert batch.output_tokens == sum(line["response"]["body"]["usage"]["completion_tokens"] for line in lines)
    # the model saw the upstream name, never the openrelay object
    bodies = sim.bodies("/v1/chat/completions")
    assert len(bodies) == 30 and all(b["model"] == "sim-upstream" for b in bodies)
    batch.input_file.refresh_from_db()
    assert batch.input_file.pins == 0
    assert batch.billed_at is not None


def test_it_splits_success_and_4xx(alice, model):
    batch = make_batch(alice.org, [chat("fine"), chat("bad [[status:400]]"), chat("fine too")])
    run_batch(batch.pk)
    batch = _finished(batch)
    assert batch.status == "completed"
    assert (batch.completed_count, batch.failed_count) == (2, 1)
    errors = read_lines(batch.error_file)
    assert errors[0]["custom_id"] == "req-2"
    assert errors[0]["error"] is None
    assert errors[0]["response"]["status_code"] == 400
    assert errors[0]["response"]["body"]["error"]["type"] == "invalid_request_error"
    assert len(read_lines(batch.output_file)) == 2
    # failed lines are free
    assert Record.objects.get(batch=batch, line=2).prompt_tokens == 0


def test_all_failed_batch_is_completed_without_output_file(alice, model):
    batch = make_batch(alice.org, [chat("x [[status:400]]"), chat("y [[status:422]]")])
    run_batch(batch.pk)
    batch = _finished(batch)
    assert batch.status == "completed" and batch.output_file is None and batch.error_file is not None
    assert batch.usage_total if hasattr(batch, "usage_total") else batch.input_tokens == 0


def test_call_time_limit_stops_the_call_and_bills_nothing(alice, model, settings):
    settings.OPENRELAY_CALL_TIME_LIMIT_S = 0.5
    batch = make_batch(alice.org, [chat("slow [[hang]]"), chat("quick")])
    started = time.monotonic()
    run_batch(batch.pk)
    assert time.monotonic() - started < 10
    batch = _finished(batch)
    errors = read_lines(batch.error_file)
    assert errors == [
        {
            "id": errors[0]["id"],
            "custom_id": "req-1",
            "response": None,
            "error": {"code": "request_time_limit", "message": errors[0]["error"]["message"]},
        }
    ]
    hung = Record.objects.get(batch=batch, line=1)
    assert hung.prompt_tokens == 0 and hung.attempts == 1


def test_failed_server_reruns_on_new_capacity(alice, model, sim):
    with (
        run_in_thread(SimulatorConfig(fail_all_status=503)) as dead,
        run_in_thread(SimulatorConfig(drop_all=True)) as dropping,
    ):
        for server in (dead, dropping):
            Deployment.objects.create(
                model=model, base_url=server.base_url, upstream_model="sim-upstream", max_concurrency=4
            )
        batch = make_batch(alice.org, [chat(f"q{i}") for i in range(12)])
        run_batch(batch.pk)
        assert dead.request_count > 0 and dropping.request_count > 0
    batch = _finished(batch)
    assert (batch.completed_count, batch.failed_count) == (12, 0)


def test_server_failing_twice_then_succeeding(alice, model, sim):
    batch = make_batch(alice.org, [chat("flaky [[status:503x2]]"), chat("reset [[dropx1]]")])
    run_batch(batch.pk)
    batch = _finished(batch)
    assert batch.completed_count == 2
    # The records' calls: the neutral requests that judged the failures (calls.health.ask) aside.
    calls = [body for body in sim.bodies("/v1/chat/completions") if body["messages"] != NEUTRAL_REQUEST["messages"]]
    assert len(calls) == 5


def test_429_waits_for_retry_after(alice, model, sim):
    batch = make_batch(alice.org, [chat("busy [[status:429x1]]")])
    started = time.monotonic()
    run_batch(batch.pk)
    assert time.monotonic() - started >= 0.2  # the simulator says Retry-After: 0.2
    assert _finished(batch).completed_count == 1


def test_expiry_keeps_finished_work_and_expires_the_rest(alice, model):
    batch = make_batch(alice.org, [chat("a"), chat("b"), chat("c")])
    done = store.claim(batch.pk, "w1", 1)
    from batches.engine.calls.caller import Usage
    from batches.engine.outcomes import RecordOutcome

    store.flush(batch.pk, "w1", [(done[0], RecordOutcome(True, 200, "req_1", {"ok": True}, usage=Usage(10, 0, 5, 0)))])
    Batch.objects.filter(pk=batch.pk).update(status="in_progress", expires_at=batch.created_at)
    report = sweep()
    assert report["expired"] == 1
    batch = _finished(batch)
    assert batch.status == "expired" and batch.expired_at and batch.finalizing_at
    assert len(read_lines(batch.output_file)) == 1
    errors = read_lines(batch.error_file)
    assert [e["error"] for e in errors] == [
        {"code": "batch_expired", "message": "This request could not be executed before the completion window expired."}
    ] * 2
    assert (batch.completed_count, batch.failed_count) == (1, 2)
    assert batch.input_tokens == 10


def test_cancel_mid_batch_keeps_finished_and_cancels_the_rest(alice, model):
    from batches import lifecycle

    batch = make_batch(alice.org, [chat("quick")] + [chat(f"slow {i} [[latency:3000]]") for i in range(5)])
    worker = threading.Thread(target=run_batch, args=(batch.pk,))
    worker.start()
    deadline = time.monotonic() + 10
    while Record.objects.filter(batch=batch, status=RecordStatus.SUCCEEDED).count() < 1:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    batch.refresh_from_db()
    assert lifecycle.transition(batch, "cancelling")
    worker.join(timeout=10)
    assert not worker.is_alive()
    batch = _finished(batch)
    assert batch.status == "cancelled" and batch.cancelled_at
    assert len(read_lines(batch.output_file)) == 1
    errors = read_lines(batch.error_file)
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"} and len(errors) == 5


def test_a_lost_lease_is_reclaimed_and_the_stale_worker_cannot_write(alice, model, settings):
    from datetime import timedelta

    from batches.engine.outcomes import RecordOutcome

    batch = make_batch(alice.org, [chat("one"), chat("two")])
    stale = store.claim(batch.pk, "dead-worker", 2, lease_s=1)
    Record.objects.filter(batch=batch).update(lease_expires_at=batch.created_at - timedelta(seconds=1))
    run_batch(batch.pk)
    # the dead worker wakes up and tries to write: nothing changes
    assert store.flush(batch.pk, "dead-worker", [(stale[0], RecordOutcome.error("x", "late"))]) == 0
    batch = _finished(batch)
    assert batch.status == "completed" and (batch.completed_count, batch.failed_count) == (2, 0)
    assert set(Record.objects.filter(batch=batch).values_list("attempts", flat=True)) == {2}


def test_a_dead_engines_many_records_are_taken_back_at_the_claim_rate(alice, model):
    """What a kill -9 leaves: hundreds of records running under a dead engine's lapsed lease and
    nothing pending. They were taken back one small claim a second (~16/s an engine: 400 took
    25 s); an engine that finds some keeps claiming them at its claim rate."""
    from datetime import timedelta

    from tests.helpers import wait_for

    batch = make_batch(alice.org, [chat(f"q{i}") for i in range(400)])
    store.claim(batch.pk, "dead-worker", 400, lease_s=1)
    Record.objects.filter(batch=batch).update(lease_expires_at=batch.created_at - timedelta(seconds=1))
    worker = threading.Thread(target=run_batch, args=(batch.pk,))
    worker.start()
    try:
        wait_for(lambda: _finished(batch).status == "completed", 8, "the dead engine's records to be redone")
    finally:
        worker.join(timeout=60)
    assert (batch.completed_count, batch.failed_count) == (400, 0)
    assert set(Record.objects.filter(batch=batch).values_list("attempts", flat=True)) == {2}


def test_finalizing_twice_writes_nothing_twice(alice, model, tmp_path):
    from batches.engine import finish
    from files.models import File

    batch = make_batch(alice.org, [chat("one"), chat("two")])
    workers = store.claim(batch.pk, "w", 2)
    from batches.engine.outcomes import RecordOutcome

    store.flush(batch.pk, "w", [(r, RecordOutcome(True, 200, "req_x", {"n": r.line})) for r in workers])
    Batch.objects.filter(pk=batch.pk).update(status="finalizing")
    first, second = Batch.objects.get(pk=batch.pk), Batch.objects.get(pk=batch.pk)
    assert finish.close(first, "completed") is True
    assert finish.close(second, "completed") is False  # the racing closer loses and rolls back
    assert File.objects.filter(purpose="batch_output", organization=alice.org).count() == 1
    stored = [p for p in (tmp_path / "files").rglob("*.jsonl")]
    assert len(stored) == 2  # the input file and one output file: the loser's bytes are gone
    assert sweep()["finalized"] == 0


def test_embeddings_and_completions_endpoints(alice, model):
    emb = make_batch(alice.org, [{"model": "openrelay/gemma-4-31b", "input": "hello"}], endpoint="/v1/embeddings")
    run_batch(emb.pk)
    line = read_lines(_finished(emb).output_file)[0]
    assert line["response"]["body"]["object"] == "list"
    comp = make_batch(alice.org, [{"model": "openrelay/gemma-4-31b", "prompt": "Say hi"}], endpoint="/v1/completions")
    run_batch(comp.pk)
    assert read_lines(_finished(comp).output_file)[0]["response"]["body"]["object"] == "text_completion"


def test_a_crash_while_closing_leaves_no_rows_and_no_bytes(alice, model, tmp_path, monkeypatch):
    from batches.engine import finish
    from billing import ledger
    from files.models import File

    batch = make_batch(alice.org, [chat("one")])
    claimed = store.claim(batch.pk, "w", 1)
    from batches.engine.outcomes import RecordOutcome

    store.flush(batch.pk, "w", [(claimed[0], RecordOutcome(True, 200, "req_x", {"n": 1}))])
    Batch.objects.filter(pk=batch.pk).update(status="finalizing")

    def crash(batch):
        raise RuntimeError("worker died mid-close")

    monkeypatch.setattr(ledger, "bill_batch", crash)
    with pytest.raises(RuntimeError):
        finish.close(Batch.objects.get(pk=batch.pk), "completed")
    assert Batch.objects.get(pk=batch.pk).status == "finalizing"
    assert not File.objects.filter(purpose="batch_output").exists()
    assert [p.name for p in (tmp_path / "files").rglob("*.jsonl")] == [batch.input_file.storage_name.split("/")[-1]]


def test_a_close_whose_storage_fails_is_tried_again_within_seconds(alice, model, monkeypatch):
    """The hosts tier's S3 down 30 s: the close moved the batch to finalizing, then could not store its
    files; no poll sees a finalizing batch, and the sweeper redoes one only after 5 minutes. The engine
    tries its failed close again itself (1 s, then doubled)."""
    from batches.engine import finish

    batch = make_batch(alice.org, [chat("one"), chat("two")])
    stored, failures = finish.file_services.create_file_from_stream, []

    def bucket_away_twice(**kwargs):
        if len(failures) < 2:
            failures.append(time.monotonic())
            raise ConnectionError("the bucket is away")
        return stored(**kwargs)

    monkeypatch.setattr(finish.file_services, "create_file_from_stream", bucket_away_twice)
    started = time.monotonic()
    run_batch(batch.pk)
    batch = _finished(batch)
    assert batch.status == "completed" and len(failures) == 2
    assert [line["custom_id"] for line in read_lines(batch.output_file)] == ["req-1", "req-2"]
    assert time.monotonic() - started < 30, "tried again within seconds (1 s, then 2 s), not the sweeper's 5 min"


def test_a_worker_stops_when_the_window_passes_and_the_batch_expires(alice, model):
    from datetime import timedelta

    batch = make_batch(
        alice.org,
        [chat("quick")] + [chat(f"slow {i} [[latency:30000]]") for i in range(4)],
        window=timedelta(seconds=1),
    )
    started = time.monotonic()
    run_batch(batch.pk)
    assert time.monotonic() - started < 15  # the 30 s calls were stopped, not waited out (room for a loaded machine)
    batch = _finished(batch)
    assert batch.status == "expired"
    assert [line["custom_id"] for line in read_lines(batch.output_file)] == ["req-1"]
    assert {e["error"]["code"] for e in read_lines(batch.error_file)} == {"batch_expired"}
