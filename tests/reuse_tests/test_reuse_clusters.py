"""Identical records run once, end to end: real q2 clusters, a simulated model server that counts
its calls (GET /_sim/calls), the result files and the ledger."""

import httpx
import pytest

from batches import services
from batches.models import Batch, Record
from batches.validation.params import CreateParams
from billing.models import LedgerEntry
from openrelay.simulator.config import SimulatorConfig
from openrelay.simulator.server import run_in_thread
from tests.helpers import chat, read_lines, status_of, wait_for

CHAT = "/v1/chat/completions"


def create(org, bodies, reuse="auto"):
    requests = [
        {"custom_id": f"req-{i}", "method": "POST", "url": CHAT, "body": body} for i, body in enumerate(bodies, start=1)
    ]
    return services.create_batch(organization=org, params=CreateParams(endpoint=CHAT, requests=requests, reuse=reuse))


def calls(sim):
    """The model calls the server counted, over HTTP as any client would ask."""
    return httpx.get(f"{sim.url}/_sim/calls").json()["total"]


def finish(batch):
    wait_for(lambda: status_of(batch) == "completed", 120, lambda: f"batch {status_of(batch)}")
    batch.refresh_from_db()
    return read_lines(batch.output_file), read_lines(batch.error_file)


def assert_billed_once(batch, out):
    """Billed usage: the lines that called the model, no reused one; the same in the ledger."""
    called = [line for line in out if "openrelay" not in line]
    assert batch.input_tokens == sum(line["response"]["body"]["usage"]["prompt_tokens"] for line in called)
    assert batch.output_tokens == sum(line["response"]["body"]["usage"]["completion_tokens"] for line in called)
    entry = LedgerEntry.objects.get(batch_id=batch.public_id)
    assert (entry.input_tokens, entry.output_tokens) == (batch.input_tokens, batch.output_tokens)
    billed = Record.objects.filter(batch=batch).values_list("prompt_tokens", flat=True)
    assert sum(billed) == batch.input_tokens


@pytest.mark.slow
def test_200_records_of_20_bodies_make_20_calls_and_200_lines(alice, model, fresh_sim, clusters):
    bodies = [chat(f"question {i % 20}", temperature=0) for i in range(200)]
    batch = create(alice.org, bodies)
    clusters()
    out, err = finish(batch)
    assert calls(fresh_sim) == 20
    assert err == [] and sorted(line["custom_id"] for line in out) == sorted(f"req-{i}" for i in range(1, 201))
    by_id = {line["custom_id"]: line for line in out}
    for i in range(21, 201):
        twin, leader = by_id[f"req-{i}"], by_id[f"req-{(i - 1) % 20 + 1}"]
        assert twin["openrelay"] == {"reused_from": {"custom_id": leader["custom_id"]}}
        assert twin["response"]["body"] == leader["response"]["body"]  # the shared answer
        assert twin["id"] != leader["id"]
    assert (batch.completed_count, batch.reused_count, batch.twin_count) == (200, 180, 180)
    assert batch.reused_input_tokens == 9 * batch.input_tokens  # each answer reused 9 times
    assert_billed_once(batch, out)


@pytest.mark.slow
def test_sampling_twins_and_off_call_the_model_for_every_record(alice, model, fresh_sim, clusters):
    sampling = create(alice.org, [chat(f"s{i % 5}") for i in range(20)])  # temperature left out
    off = create(alice.org, [chat(f"d{i % 5}", temperature=0) for i in range(20)], reuse="off")
    clusters()
    for batch in (sampling, off):
        out, _ = finish(batch)
        assert len(out) == 20 and not any("openrelay" in line for line in out)
        assert batch.reused_count == 0
    assert calls(fresh_sim) == 40


@pytest.mark.slow
def test_kill_9_mid_batch_leaves_no_twin_without_its_answer(alice, model, clusters):
    # Slow calls (100 leaders take 2.5 s at 8 at once), so the kill finds leaders in flight and
    # twins waiting however loaded the machine; short leases, so the
    # second cluster takes the dead one's leaders back soon.
    with run_in_thread(SimulatorConfig(latency_ms=200)) as slow:
        model.deployments.update(base_url=slow.base_url, max_concurrency=8)
        batch = create(alice.org, [chat(f"q{i % 100}", temperature=0) for i in range(600)])
        first = clusters(OPENRELAY_LEASE_S=3)
        wait_for(lambda: Batch.objects.get(pk=batch.pk).reused_count >= 100, 120, "some twins settled")
        first.kill()
        assert Record.objects.filter(batch=batch, status="waiting").exists()  # mid-batch indeed
        clusters(OPENRELAY_LEASE_S=3)
        out, err = finish(batch)
        assert err == [] and len(out) == 600 and len({line["custom_id"] for line in out}) == 600
        assert sum(1 for line in out if "openrelay" in line) == 500
        # Each distinct request was answered once or, for a leader in flight at the kill, again:
        # never once per twin.
        assert 100 <= calls(slow) < 100 + 8 * 2
        assert_billed_once(batch, out)


@pytest.mark.slow
def test_cache_answers_a_later_batch_of_the_organization_only(alice, bob, model, fresh_sim, clusters):
    bodies = [chat(f"c{i % 10}", temperature=0) for i in range(50)]
    first = create(alice.org, bodies, reuse="cache")
    clusters()
    finish(first)
    assert calls(fresh_sim) == 10
    later = create(alice.org, bodies, reuse="cache")
    out, _ = finish(later)
    assert calls(fresh_sim) == 10  # not one more
    assert len(out) == 50 and all(line["openrelay"]["reused_from"]["batch_id"] == first.public_id for line in out)
    assert (later.cache_hit_count, later.input_tokens) == (50, 0)
    assert_billed_once(later, out)
    other = create(bob.org, bodies, reuse="cache")
    finish(other)
    assert calls(fresh_sim) == 20 and other.cache_hit_count == 0
