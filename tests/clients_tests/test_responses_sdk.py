"""The openai SDK runs /v1/responses and /v1/moderations batches end to end: uvicorn, a real worker
cluster, the simulated model server behind an upstream name the results must not show."""

import json
import time

import openai
import pytest

from tests.helpers import MODEL

pytestmark = pytest.mark.django_db(transaction=True)


def run(client, tmp_path, endpoint, bodies, deadline_s=60):
    path = tmp_path / "requests.jsonl"
    path.write_text(
        "".join(
            json.dumps({"custom_id": f"r{i}", "method": "POST", "url": endpoint, "body": {"model": MODEL, **body}})
            + "\n"
            for i, body in enumerate(bodies)
        )
    )
    upload = client.files.create(file=path.open("rb"), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint=endpoint, completion_window="24h")
    deadline = time.monotonic() + deadline_s
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        assert time.monotonic() < deadline, f"{batch.id} still {batch.status}"
        time.sleep(0.1)
        batch = client.batches.retrieve(batch.id)
    output = client.files.content(batch.output_file_id).text if batch.output_file_id else ""
    return batch, [json.loads(line) for line in output.splitlines()]


def test_the_sdk_runs_a_responses_batch(live_stack, model, alice, tmp_path):
    client = openai.OpenAI(base_url=f"{live_stack.url}/v1", api_key=alice.key, max_retries=0)
    bodies = [{"input": f"Question {i}"} for i in range(20)]
    bodies.append(
        {
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "Think."}]}],
            "reasoning": {"effort": "low"},
        }
    )
    bodies.append({"input": "later", "background": True})  # rejected at create, the rest run

    batch, output = run(client, tmp_path, "/v1/responses", bodies)

    assert batch.status == "completed" and batch.endpoint == "/v1/responses"
    assert [(e.line, e.code, e.param) for e in batch.errors.data] == [(22, "unsupported_parameter", "body.background")]
    assert batch.request_counts.completed == 21 and batch.model == MODEL
    assert {line["response"]["body"]["object"] for line in output} == {"response"}
    assert {line["response"]["body"]["model"] for line in output} == {MODEL}
    assert "Simulated response to: Question 7" in json.dumps(output[7])
    usages = [line["response"]["body"]["usage"] for line in output]
    assert batch.usage.input_tokens == sum(u["input_tokens"] for u in usages)
    assert batch.usage.output_tokens == sum(u["output_tokens"] for u in usages)
    assert batch.usage.output_tokens_details.reasoning_tokens == 16
    assert batch.model_extra["openrelay"]["implausible_usage"] == 0


def test_the_sdk_runs_a_moderations_batch_billed_at_zero(live_stack, model, alice, tmp_path):
    client = openai.OpenAI(base_url=f"{live_stack.url}/v1", api_key=alice.key, max_retries=0)

    batch, output = run(client, tmp_path, "/v1/moderations", [{"input": "text one"}, {"input": ["a", "b"]}])

    assert (batch.status, batch.request_counts.completed) == ("completed", 2)
    assert [len(line["response"]["body"]["results"]) for line in output] == [1, 2]
    assert batch.usage is None  # no token was reported, none is billed
