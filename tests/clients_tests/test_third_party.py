"""The batch tools people already use, unchanged, against a running gateway (issue 50): litellm's batch
calls, openbatch's file writer with the openai SDK, and openai-batch. One small batch each, end to end
(uvicorn, a real worker cluster, the simulated model server), failing on any warning what we answer
causes them (litellm parsed `usage.cost` as a float and warned on every retrieve_batch).

What is theirs and not ours is left as it is and said where it shows: openai-batch's `submit` closes its
own input file before reading it, so that step is the openai SDK's here; openbatch's
`chat.completions.parse` writes the Responses API's `{"format": ...}` into a chat `response_format`,
which we refuse at create as OpenAI would.
"""

import json
import time
import warnings

import openai
import pytest
from pydantic import BaseModel

from tests.helpers import MODEL

pytestmark = pytest.mark.django_db(transaction=True)

DONE = ("completed", "failed", "expired", "cancelled")


def _no_warnings(caught):
    """No warning about what we answered. pydantic's warnings while it builds a schema for a client's own
    types (litellm imports modules lazily, on its first call of each kind) say nothing of our answers."""
    shown = [
        f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})"
        for w in caught
        if not w.filename.endswith("pydantic/_internal/_generate_schema.py")
    ]
    assert shown == [], shown


def _chat_lines(count):
    return [
        {
            "custom_id": f"r{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": [{"role": "user", "content": f"Question {i}"}], "max_tokens": 20},
        }
        for i in range(count)
    ]


def test_litellm_runs_a_batch_and_reads_what_we_answer_without_a_warning(
    live_stack, model, alice, tmp_path, monkeypatch
):
    # litellm fetches its model price map from GitHub at import unless told to use its own copy.
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in _chat_lines(3)))
    slow = tmp_path / "slow.jsonl"  # a batch still running when it is cancelled: its call takes 3 s
    [line] = _chat_lines(1)
    line["body"]["messages"][0]["content"] = "[[latency:3000]] slow"
    slow.write_text(json.dumps(line) + "\n")
    where = {"custom_llm_provider": "openai", "api_base": f"{live_stack.url}/v1", "api_key": alice.key}

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with path.open("rb") as handle:
            upload = litellm.create_file(file=handle, purpose="batch", **where)
        batch = litellm.create_batch(
            completion_window="24h", endpoint="/v1/chat/completions", input_file_id=upload.id, **where
        )
        deadline = time.monotonic() + 60
        while batch.status not in DONE:
            assert time.monotonic() < deadline, f"{batch.id} still {batch.status}"
            time.sleep(0.2)
            batch = litellm.retrieve_batch(batch_id=batch.id, **where)
        content = litellm.file_content(file_id=batch.output_file_id, **where)
        listed = litellm.list_batches(limit=5, **where)
        with slow.open("rb") as handle:
            slow_upload = litellm.create_file(file=handle, purpose="batch", **where)
        other = litellm.create_batch(
            completion_window="24h", endpoint="/v1/chat/completions", input_file_id=slow_upload.id, **where
        )
        cancelled = litellm.cancel_batch(batch_id=other.id, **where)
    _no_warnings(caught)

    assert batch.status == "completed" and batch.request_counts.completed == 3
    assert batch.usage.total_tokens == batch.usage.input_tokens + batch.usage.output_tokens > 0
    lines = [json.loads(line) for line in content.content.decode().splitlines()]
    assert sorted(line["custom_id"] for line in lines) == ["r0", "r1", "r2"]
    assert {line["response"]["status_code"] for line in lines} == {200}
    assert batch.id in [item.id for item in listed.data]
    assert cancelled.status in ("cancelling", "cancelled")


class Answer(BaseModel):
    text: str


def test_openbatch_writes_a_file_the_openai_sdk_runs(live_stack, model, alice, tmp_path):
    from openbatch import BatchCollector

    path = tmp_path / "requests.jsonl"
    collector = BatchCollector(path)
    for i in range(3):
        collector.chat.completions.create(f"r{i}", MODEL, messages=[{"role": "user", "content": f"Question {i}"}])
    # Its parse() writes the Responses API's shape into a chat body: refused at create, as OpenAI refuses it.
    collector.chat.completions.parse(
        "parsed", MODEL, response_format=Answer, messages=[{"role": "user", "content": "x"}]
    )
    collector.responses.create("elsewhere", MODEL, input="not a chat line")  # another endpoint's line: refused

    client = openai.OpenAI(base_url=f"{live_stack.url}/v1", api_key=alice.key, max_retries=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with path.open("rb") as handle:
            upload = client.files.create(file=handle, purpose="batch")
        batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
        deadline = time.monotonic() + 60
        while batch.status not in DONE:
            assert time.monotonic() < deadline, f"{batch.id} still {batch.status}"
            time.sleep(0.2)
            batch = client.batches.retrieve(batch.id)
        output = client.files.content(batch.output_file_id).text
    _no_warnings(caught)

    assert batch.status == "completed" and batch.request_counts.completed == 3
    assert [(e.line, e.code, e.param) for e in batch.errors.data] == [
        (4, "missing_required_parameter", "body.response_format.type"),
        (5, "invalid_url", "url"),
    ]
    assert sorted(json.loads(line)["custom_id"] for line in output.splitlines()) == ["r0", "r1", "r2"]
    assert set(batch.usage.model_dump()) == {
        "input_tokens",
        "input_tokens_details",
        "output_tokens",
        "output_tokens_details",
        "total_tokens",
    }


def test_openai_batch_writes_a_batch_and_reads_its_status_and_results(live_stack, model, alice, tmp_path):
    from openai_batch import Batch
    from openai_batch.providers import Provider

    ours = Provider(name="openrelay", base_url=f"{live_stack.url}/v1", api_key=alice.key)
    path = tmp_path / "requests.jsonl"
    with Batch(submission_input_file=path, provider=ours) as writer:
        for i in range(3):
            writer.add_to_batch(model=MODEL, max_completion_tokens=20, messages=[{"role": "user", "content": f"Q{i}"}])
    # Its submit() closes the input file before reading it (its bug, not ours): the upload is the SDK's.
    client = ours.get_client()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with path.open("rb") as handle:
            upload = client.files.create(file=handle, purpose="batch")
        created = client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        reader = Batch(
            batch_id=created.id,
            provider=ours,
            output_file=tmp_path / "output.jsonl",
            error_file=tmp_path / "errors.jsonl",
        )
        deadline = time.monotonic() + 60
        while (status := reader.status()).status not in DONE:
            assert time.monotonic() < deadline, f"{created.id} still {status.status}"
            time.sleep(0.2)
        output_path, error_path = reader.download()
    _no_warnings(caught)

    assert status.status == "completed" and status.request_counts.completed == 3
    assert error_path is None
    lines = [json.loads(line) for line in (tmp_path / "output.jsonl").read_text().splitlines()]
    assert sorted(line["custom_id"] for line in lines) == ["line-1", "line-2", "line-3"]
    assert all(line["response"]["body"]["choices"][0]["message"]["content"] for line in lines)
