"""Faults from model servers, all in one batch: each record ends exactly once, with
the right outcome and code; failed-server calls rerun once the server is back in the
rotation; hangs end in request_time_limit and are not billed."""

import time
from collections import Counter

import pytest

from batches.engine.runner import run_batch
from batches.models import Batch, Record
from openrelay.core.models import Deployment
from openrelay.simulator.config import SimulatorConfig
from openrelay.simulator.server import run_in_thread
from tests.helpers import chat, make_batch, read_lines

# custom_id -> (prompt, expected outcome, model calls the simulator should see for it)
# outcome: ("ok",) | ("response", status) | ("error", code)
RETRIES = 3
CASES = {
    "plain": ("plain question", ("ok",), 1),
    "flaky-503": ("flaky [[status:503x2]]", ("ok",), 3),
    "flaky-502": ("bad gateway once [[status:502x1]]", ("ok",), 2),
    "reset-once": ("reset [[dropx1]]", ("ok",), 2),
    "reset-twice": ("reset twice [[dropx2]]", ("ok",), 3),
    "busy-once": ("busy [[status:429x1]]", ("ok",), 2),
    "bad-request": ("bad [[status:400]]", ("response", 400), 1),
    "unprocessable": ("unprocessable [[status:422]]", ("response", 422), 1),
    # A 500 is sent again (a proxy answers one for a dead upstream); when a neutral request (or another
    # call) is answered meanwhile, the 500s are the record's: it fails alone, the answer kept.
    "server-error": ("internal [[status:500]]", ("error", "record_fails_upstream"), 3),
    "always-busy": ("always busy [[status:429]]", ("response", 429), RETRIES + 1),
    # A request that draws 3 server failures while the server answers others (a neutral request, the
    # other records) fails alone: it may be what takes the server down.
    "always-503": ("dead [[status:503]]", ("error", "record_fails_upstream"), 3),
    "always-reset": ("never answers [[drop]]", ("error", "record_fails_upstream"), 3),
    "hang": ("hangs [[hang]]", ("error", "request_time_limit"), 1),
    "slow": ("slower than the limit [[latency:4000]]", ("error", "request_time_limit"), 1),
}


def _prompt_of(body):
    return body["messages"][-1]["content"]


@pytest.fixture
def faulty(settings, transactional_db):
    settings.OPENRELAY_CALL_TIME_LIMIT_S = 1.0
    settings.OPENRELAY_UPSTREAM_RETRIES = RETRIES
    with run_in_thread(SimulatorConfig(retry_after_s=0.1)) as server:
        yield server


def _outcome(line):
    if line["error"] is not None:
        return ("error", line["error"]["code"])
    status = line["response"]["status_code"]
    return ("ok",) if status == 200 else ("response", status)


def test_a_batch_mixing_every_fault_ends_each_record_once_with_the_right_outcome(alice, faulty):
    from openrelay.core.models import Model

    model = Model.objects.create(name="openrelay/gemma-4-31b")
    Deployment.objects.create(model=model, base_url=faulty.base_url, upstream_model="sim-upstream", max_concurrency=16)
    # Several copies of each case (distinct bodies, so the simulator counts each one separately).
    cases = [(name, chat(f"{CASES[name][0]} #{copy}")) for copy in range(3) for name in CASES]
    bodies = [body for _, body in cases]
    batch = make_batch(alice.org, bodies)
    started = time.monotonic()
    run_batch(batch.pk)
    elapsed = time.monotonic() - started
    batch = Batch.objects.get(pk=batch.pk)
    assert batch.status == "completed"

    out, err = read_lines(batch.output_file), read_lines(batch.error_file)
    lines = out + err
    # Exactly once: every record in exactly one of the two files.
    assert sorted(line["custom_id"] for line in lines) == sorted(f"req-{i}" for i in range(1, len(bodies) + 1))
    assert (batch.completed_count, batch.failed_count) == (len(out), len(err))
    assert all(line["response"]["status_code"] == 200 for line in out)

    calls = Counter(_prompt_of(body) for body in faulty.bodies("/v1/chat/completions"))
    by_id = {line["custom_id"]: line for line in lines}
    for index, (name, body) in enumerate(cases, start=1):
        _, expected, expected_calls = CASES[name]
        line = by_id[f"req-{index}"]
        assert _outcome(line) == expected, (name, line)
        # Failed-server calls were rerun; answered errors were not.
        assert calls[_prompt_of(body)] == expected_calls, (name, calls[_prompt_of(body)])

    # Every record ran once from the engine's point of view (reruns are calls, not attempts).
    assert set(Record.objects.filter(batch=batch).values_list("attempts", flat=True)) == {1}
    # Hangs stopped at the limit are free; so is every failed line.
    for record in Record.objects.filter(batch=batch, status="failed"):
        assert (record.prompt_tokens, record.completion_tokens) == (0, 0), record.custom_id
    timed_out = [line for line in err if line["error"] and line["error"]["code"] == "request_time_limit"]
    assert len(timed_out) == 6 and all(line["response"] is None for line in timed_out)
    assert "within 1 second" in timed_out[0]["error"]["message"]
    # Billed usage is exactly the sum over the output lines.
    assert batch.input_tokens == sum(line["response"]["body"]["usage"]["prompt_tokens"] for line in out)
    assert batch.output_tokens == sum(line["response"]["body"]["usage"]["completion_tokens"] for line in out)
    assert batch.input_tokens > 0
    # Error lines keep the model's answer (the OpenAI line shape) for answered errors.
    answered = [line for line in err if line["response"] is not None]
    assert all(set(line["response"]["body"]["error"]) == {"message", "type", "param", "code"} for line in answered)
    # Hangs ran concurrently with everything else, bounded by the call limit.
    assert elapsed < 30


def test_429_honours_retry_after_before_the_rerun(alice, faulty):
    from openrelay.core.models import Model

    model = Model.objects.create(name="openrelay/gemma-4-31b")
    Deployment.objects.create(model=model, base_url=faulty.base_url, upstream_model="sim-upstream", max_concurrency=4)
    with run_in_thread(SimulatorConfig(retry_after_s=1.5)) as slow_to_forgive:
        model.deployments.update(base_url=slow_to_forgive.base_url)
        batch = make_batch(alice.org, [chat("busy [[status:429x1]]")])
        started = time.monotonic()
        run_batch(batch.pk)
        assert time.monotonic() - started >= 1.5
        assert slow_to_forgive.request_count == 2
    assert Batch.objects.get(pk=batch.pk).completed_count == 1


def test_a_failed_server_reruns_on_another_deployment(alice, faulty):
    from openrelay.core.models import Model

    model = Model.objects.create(name="openrelay/gemma-4-31b")
    with (
        run_in_thread(SimulatorConfig(drop_all=True)) as resetting,
        run_in_thread(SimulatorConfig(fail_all_status=503)) as unavailable,
    ):
        for server in (resetting, unavailable, faulty):
            Deployment.objects.create(
                model=model, base_url=server.base_url, upstream_model="sim-upstream", max_concurrency=4
            )
        batch = make_batch(alice.org, [chat(f"q{i}") for i in range(24)])
        run_batch(batch.pk)
        assert resetting.request_count > 0 and unavailable.request_count > 0
    batch = Batch.objects.get(pk=batch.pk)
    assert (batch.completed_count, batch.failed_count) == (24, 0)
    out = read_lines(batch.output_file)
    assert batch.input_tokens == sum(line["response"]["body"]["usage"]["prompt_tokens"] for line in out)


@pytest.mark.parametrize("limit", [0, -1, -50])
def test_a_claim_with_no_room_claims_nothing(alice, faulty, limit):
    # Found by the fault batch on PostgreSQL: a task whose share grew mid-run asked for
    # LIMIT -1 (a DataError there; on SQLite, "no limit": the whole batch to one task).
    from batches.engine import store
    from openrelay.core.models import Model

    model = Model.objects.create(name="openrelay/gemma-4-31b")
    batch = make_batch(alice.org, [chat(f"q{i}") for i in range(20)], model=model)
    assert store.claim(batch.pk, "w1", limit) == []
    assert not Record.objects.filter(batch=batch, status="running").exists()
