"""Tool-calling records through the API and the worker, down to the result files."""

import asyncio
from datetime import timedelta

import orjson
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone

from batches.engine import store
from batches.engine.calls.caller import ModelCaller, Upstream, Usage
from batches.engine.loops import toolloop
from batches.engine.runner import run_batch
from batches.models import Batch, Record
from files.services import open_content
from openrelay.lib.outbound import OutboundClient
from openrelay.simulator.answers import answer_chat
from tests.fixtures.tool_executor import per_record, status
from tests.helpers import deploy
from tests.tool_tests.conftest import CHAT, record_context

MODEL = "openrelay/tool-model"
UPSTREAM = "sim-upstream"
SECRET = "Bearer tool-secret-123"
WEATHER_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}
CLOCK_TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}


pytestmark = pytest.mark.usefixtures("tmp_storage")  # stored files in tmp_path (tests/fixtures/storage.py)


@pytest.fixture
def model(transactional_db, sim, settings):
    """Overrides the shared `model`: another model name, on the session's simulator, max_concurrency 8."""
    settings.OPENRELAY_ALLOW_PRIVATE_URLS = True  # the executor listens on 127.0.0.1
    return deploy(MODEL, sim.base_url, upstream_model=UPSTREAM, max_concurrency=8)


def line(custom_id, text, tools=(WEATHER_TOOL,), tool_config=None):
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "tools": list(tools)}
    if tool_config is not None:
        body["openrelay"] = {"tool_config": tool_config}
    return {"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body}


def create_batch(persona, lines):
    """Upload the lines and create a batch from them, through the API."""
    content = b"".join(orjson.dumps(item) + b"\n" for item in lines)
    upload = SimpleUploadedFile("tools.jsonl", content, content_type="application/jsonl")
    response = persona.client.post("/v1/files", {"purpose": "batch", "file": upload}, format="multipart")
    assert response.status_code == 200, response.content
    body = {"input_file_id": response.json()["id"], "endpoint": CHAT, "completion_window": "24h"}
    response = persona.client.post("/v1/batches", body, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["errors"] is None
    return Batch.objects.get(public_id=response.json()["id"])


def read_raw(file):
    with open_content(file) as f:
        return f.read()


def by_custom_id(raw):
    return {item["custom_id"]: item for item in map(orjson.loads, raw.splitlines())}


def turns_usage(sim, text):
    """What the simulator charged for the turns of the record asking `text`.

    Its answers are a pure function of the request body, so replaying the
    recorded requests gives each turn's usage independently of the engine.
    """
    bodies = [b for b in sim.bodies(CHAT) if b["messages"][0]["content"] == text]
    return len(bodies), sum((Usage.from_body(answer_chat(b)) for b in bodies), Usage())


def test_it_runs_tool_records_to_result_files(alice, model, sim, executor):
    executor.answer(per_record({"broken": status(500)}))
    tool_config = {
        "url": executor.url + "?token=query-secret",
        "authorization": SECRET,
        "context": {"contractId": "c-1"},
    }
    texts = {
        "rounds": "Weather twice [[tool_rounds:2]]",
        "parallel": "Both [[tool_calls:2]]",
        "plain": "No executor here",
        "broken": "This one fails",
    }
    batch = create_batch(
        alice,
        [
            line("rounds", texts["rounds"], tool_config=tool_config),
            line(
                "parallel",
                texts["parallel"],
                tools=(WEATHER_TOOL, CLOCK_TOOL),
                tool_config={**tool_config, "max_rounds": 99},
            ),
            line("plain", texts["plain"]),
            line("broken", texts["broken"], tool_config=tool_config),
        ],
    )

    run_batch(batch.pk)

    batch.refresh_from_db()
    assert batch.status == "completed"
    output, errors = read_raw(batch.output_file), read_raw(batch.error_file)
    for raw in (output, errors):
        assert b"tool_config" not in raw and b"tool-secret" not in raw and b"query-secret" not in raw
    lines = by_custom_id(output)
    assert set(lines) == {"rounds", "parallel", "plain"}

    for custom_id, rounds, calls in (("rounds", 2, 3), ("parallel", 1, 2)):
        body = lines[custom_id]["response"]["body"]
        assert body["openrelay"] == {"tool_rounds": rounds}
        assert body["choices"][0]["finish_reason"] == "stop"
        count, usage = turns_usage(sim, texts[custom_id])
        assert count == calls
        assert body["usage"] == usage.as_openai()
        record = Record.objects.get(batch=batch, custom_id=custom_id)
        assert (record.prompt_tokens, record.completion_tokens) == (usage.prompt_tokens, usage.completion_tokens)

    plain = lines["plain"]["response"]["body"]
    assert plain["choices"][0]["finish_reason"] == "tool_calls" and "openrelay" not in plain
    assert turns_usage(sim, texts["plain"])[0] == 1

    [broken] = map(orjson.loads, errors.splitlines())
    assert broken["custom_id"] == "broken" and broken["response"] is None
    assert broken["error"] == {
        "code": "tool_execution_failed",
        "message": "The tool executor answered with non-2xx status 500.",
    }
    assert turns_usage(sim, texts["broken"])[0] == 1

    # Billed: every turn of the output lines, nothing of the failed record.
    billed = sum((turns_usage(sim, texts[c])[1] for c in ("rounds", "parallel", "plain")), Usage())
    assert (batch.input_tokens, batch.output_tokens) == (billed.prompt_tokens, billed.completion_tokens)

    assert all("openrelay" not in b and b["model"] == UPSTREAM for b in sim.bodies(CHAT))
    received = {r["json"]["custom_id"] for r in executor.received}
    assert received == {"rounds", "parallel", "broken"}
    assert all(r["headers"]["Authorization"] == SECRET for r in executor.received)
    assert all(r["json"]["context"] == {"contractId": "c-1"} for r in executor.received)


def run_as_lost_worker(batch):
    """A worker claims the record and runs it, then dies before flushing (its lease runs out)."""
    [claimed] = store.claim(batch.pk, "lost-worker", 10)
    with open_content(batch.input_file) as f:
        f.seek(claimed.offset)
        body = orjson.loads(f.read(claimed.length))["body"]
    base_url = batch.model.deployments.get().base_url

    async def go():
        caller = ModelCaller([Upstream(base_url, UPSTREAM, "", 8)], time_limit_s=10, retries=0)
        async with caller, OutboundClient(allow_private=True) as outbound:
            return await toolloop.run(record_context(caller, outbound), claimed, body)

    outcome = asyncio.run(go())
    Record.objects.filter(pk=claimed.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    return claimed, outcome


def test_it_reruns_a_record_whose_lease_was_lost_and_bills_one_run(alice, model, sim, executor):
    text = "Weather twice [[tool_rounds:2]]"
    batch = create_batch(alice, [line("again", text, tool_config={"url": executor.url})])
    claimed, lost_outcome = run_as_lost_worker(batch)

    run_batch(batch.pk)

    # The executor saw the same tool calls twice: it must be idempotent.
    assert executor.tool_call_ids() == [["call_0_0"], ["call_1_0"], ["call_0_0"], ["call_1_0"]]
    record = Record.objects.get(pk=claimed.pk)
    assert record.status == "succeeded" and record.attempts == 2
    stored = Usage(record.prompt_tokens, record.cached_tokens, record.completion_tokens, record.reasoning_tokens)
    assert stored == lost_outcome.usage  # one run's usage, not two
    batch.refresh_from_db()
    assert batch.input_tokens == lost_outcome.usage.prompt_tokens
    assert by_custom_id(read_raw(batch.output_file))["again"]["response"]["body"]["usage"] == stored.as_openai()
    # The lost worker coming back can't store its outcome over the rerun's.
    assert store.flush(batch.pk, "lost-worker", [(claimed, lost_outcome)]) == 0
