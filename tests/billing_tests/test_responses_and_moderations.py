"""Responses and moderations batches, billed from what the server reports in their own shapes."""

from batches.engine.runner import run_batch
from batches.models import Batch
from batches.presenters import batch_object
from billing.models import LedgerEntry
from tests.billing_tests.conftest import LONG, oracle_cost
from tests.helpers import MODEL, read_lines

RESPONSES, MODERATIONS = "/v1/responses", "/v1/moderations"


def create(persona, endpoint, bodies):
    requests = [
        {"custom_id": f"req-{i}", "method": "POST", "url": endpoint, "body": {"model": MODEL, **body}}
        for i, body in enumerate(bodies, start=1)
    ]
    response = persona.client.post(
        "/v1/batches", {"endpoint": endpoint, "completion_window": "24h", "requests": requests}, format="json"
    )
    assert response.status_code == 200 and response.json()["errors"] is None, response.content
    return Batch.objects.get(public_id=response.json()["id"])


def test_a_responses_batch_bills_input_cached_output_and_reasoning_tokens(alice, model):
    items = [{"role": "user", "content": [{"type": "input_text", "text": LONG}]}]
    batch = create(
        alice,
        RESPONSES,
        [
            {"input": LONG},
            {"input": items, "instructions": "Be brief.", "reasoning": {"effort": "high"}},
            {"input": "short"},
        ],
    )
    run_batch(batch.pk)
    batch.refresh_from_db()

    output = read_lines(batch.output_file)
    assert [line["response"]["body"]["object"] for line in output] == ["response"] * 3
    assert {line["response"]["body"]["model"] for line in output} == {MODEL}
    usages = [line["response"]["body"]["usage"] for line in output]
    prompt = sum(u["input_tokens"] for u in usages)
    cached = sum(u["input_tokens_details"]["cached_tokens"] for u in usages)
    completion = sum(u["output_tokens"] for u in usages)
    reasoning = sum(u["output_tokens_details"]["reasoning_tokens"] for u in usages)
    assert cached > 0 and reasoning == 256
    entry = LedgerEntry.objects.get(batch_id=batch.public_id)
    assert (entry.input_tokens, entry.cached_tokens, entry.output_tokens, entry.reasoning_tokens) == (
        prompt,
        cached,
        completion,
        reasoning,
    )
    assert (
        entry.input_cost_nanos,
        entry.cached_input_cost_nanos,
        entry.output_cost_nanos,
        entry.total_cost_nanos,
    ) == oracle_cost(prompt, cached, completion)
    usage = batch_object(batch)["usage"]
    assert usage["output_tokens_details"] == {"reasoning_tokens": reasoning}
    assert batch_object(batch)["openrelay"]["implausible_usage"] == 0


def test_a_moderations_batch_is_billed_zero_tokens(alice, model):
    batch = create(alice, MODERATIONS, [{"input": "some text"}, {"input": ["one", "two"]}])
    run_batch(batch.pk)
    batch.refresh_from_db()

    output = read_lines(batch.output_file)
    assert [len(line["response"]["body"]["results"]) for line in output] == [1, 2]
    assert {line["response"]["body"]["model"] for line in output} == {MODEL}
    assert (batch.status, batch.completed_count) == ("completed", 2)
    entry = LedgerEntry.objects.get(batch_id=batch.public_id)
    assert (entry.input_tokens, entry.output_tokens, entry.total_cost_nanos) == (0, 0, 0)
    # Moderations report no usage by design: nothing to doubt.
    assert batch_object(batch)["openrelay"]["implausible_usage"] == 0
