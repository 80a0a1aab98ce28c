"""Contracts with tool loops and workflows, the retry of invalid outputs, and what the SDKs parse."""

import orjson
import pytest
from openai.types import BatchError
from openai.types.chat import ChatCompletion

from batches import services
from batches.engine.calls.usage import Usage
from batches.engine.runner import run_batch
from batches.models import Batch
from openrelay.simulator.answers import answer_chat
from tests.contract_tests.conftest import chat_body, content_of, line, person_format, run
from tests.helpers import CHAT

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


@pytest.fixture
def private_urls(settings):
    settings.OPENRELAY_ALLOW_PRIVATE_URLS = True  # the executor and the callback listen on 127.0.0.1


def test_a_tool_loop_checks_its_final_answer_and_reasks_after_its_rounds(alice, model, sim, executor, private_urls):
    text = "Weather? [[tool_rounds:2]] [[invalid_output:wrong_type]]"
    body = chat_body(
        text, tools=[TOOL], response_format=person_format(), openrelay={"tool_config": {"url": executor.url}}
    )
    batch, out, err = run(alice, [line("r", body)])
    assert not err
    answer = out["r"]["response"]["body"]
    assert answer["openrelay"] == {"tool_rounds": 2, "reasks": 1}
    assert content_of(out["r"]) == {"name": "sim", "age": 0}
    calls = [b for b in sim.bodies(CHAT) if b["messages"][0]["content"] == text]
    assert len(calls) == 4  # two tool rounds, the answer, its re-ask
    roles = [m["role"] for m in calls[-1]["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant", "user"]
    assert len(executor.received) == 2  # the re-ask ran no tool round again
    assert answer["usage"]["prompt_tokens"] == batch.input_tokens
    assert (batch.reasked_count, batch.reasks_count) == (1, 1)


def test_a_tool_loop_whose_answer_stays_invalid_fails_billed(alice, model, sim, executor, private_urls):
    text = "Weather? [[tool_rounds:1]] [[invalid_output:not_jsonx9]]"
    contract = {"tool_config": {"url": executor.url}, "output_contract": {"max_reasks": 1}}
    body = chat_body(text, tools=[TOOL], response_format=person_format(), openrelay=contract)
    batch, out, err = run(alice, [line("r", body)])
    assert not out and err["r"]["error"]["code"] == "invalid_output"
    assert err["r"]["response"]["body"]["openrelay"]["tool_rounds"] == 1
    assert err["r"]["response"]["body"]["openrelay"]["reasks"] == 1
    # The loop ended; its answer failed the contract: every turn is billed (the tool round, the
    # answer, its re-ask), as the error line's usage says. Nothing is left unbilled.
    assert len([b for b in sim.bodies(CHAT) if b["messages"][0]["content"] == text]) == 3
    assert err["r"]["response"]["body"]["usage"]["prompt_tokens"] == batch.input_tokens > 0
    assert batch.unbilled_input_tokens == 0


def test_a_workflow_request_that_asks_for_json_is_checked_and_reasked(alice, model, sim, callback, private_urls):
    alice.org.workflows_enabled = True
    alice.org.save(update_fields=["workflows_enabled"])

    def script(payload):
        if payload["step"] == 1:
            requests = [
                {"id": "fixed", "body": chat_body("A [[invalid_output:wrong_type]]", response_format=person_format())},
                {
                    "id": "stuck",
                    "body": chat_body(
                        "B [[invalid_output:wrong_typex9]]",
                        response_format=person_format(),
                        openrelay={"output_contract": {"max_reasks": 1}},
                    ),
                },
            ]
            return {"status": "continue", "requests": requests}
        return {"status": "completed", "output": payload["results"]}

    callback.answer(script)
    body = chat_body("start", openrelay={"workflow": {"url": callback.url}})
    batch, out, err = run(alice, [line("w", body)])
    assert not err
    fixed, stuck = out["w"]["response"]["body"]["output"]
    assert fixed["status"] == "succeeded"
    assert fixed["response"]["body"]["openrelay"] == {"reasks": 1}
    assert stuck["status"] == "failed" and stuck["error"]["code"] == "invalid_output"
    assert stuck["response"]["body"]["openrelay"]["reasks"] == 1
    # Billed: every call that got an answer: the root, the fixed request's two and the invalid one's
    # two (issue 56: an invalid request was free before).
    usage = out["w"]["response"]["body"]["usage"]
    assert batch.input_tokens == usage["prompt_tokens"]
    stuck_calls = [b for b in sim.bodies(CHAT) if b["messages"][0]["content"].startswith("B ")]
    assert len(stuck_calls) == 2 and len(sim.bodies(CHAT)) == 5
    every = sum((Usage.from_body(answer_chat(b)) for b in sim.bodies(CHAT)), Usage())
    assert batch.input_tokens == every.prompt_tokens and batch.output_tokens == every.completion_tokens


def test_a_retry_of_invalid_outputs_keeps_the_batch_contract(alice, model, sim):
    lines = [line("r", chat_body('Q [[answer_json:{"a": 1}]]'))]
    batch, _, err = run(alice, lines, openrelay={"output_contract": {"schema": {"required": ["b"]}, "max_reasks": 0}})
    assert err["r"]["error"]["code"] == "invalid_output"
    retry = services.retry_failed(batch)
    assert retry.output_contract == {"schema": {"required": ["b"]}, "max_reasks": 0}


def test_the_openai_sdk_creates_with_a_contract_and_parses_every_line(alice, model, sim, sdk, tmp_path):
    lines = [
        line("ok", chat_body("Q [[invalid_output:missing_field]]", response_format=person_format())),
        line("bad", chat_body("Q [[invalid_output:truncatedx9]]", response_format=person_format())),
        line("any", chat_body('Q [[answer_json:{"label": 1}]]')),
    ]
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(orjson.dumps(item) + b"\n" for item in lines))
    upload = sdk.files.create(file=path.open("rb"), purpose="batch")
    contract = {"output_contract": {"schema": {"type": "object", "required": ["label"]}, "max_reasks": 1}}
    created = sdk.batches.create(
        input_file_id=upload.id, endpoint=CHAT, completion_window="24h", extra_body={"openrelay": contract}
    )
    run_batch(Batch.objects.get(public_id=created.id).pk)
    batch = sdk.batches.retrieve(created.id)
    assert batch.model_extra["openrelay"]["output_contracts"] == {"reasked": 2, "reasks": 2, "invalid_output": 1}
    assert (batch.request_counts.completed, batch.request_counts.failed) == (2, 1)
    output = [orjson.loads(x) for x in sdk.files.content(batch.output_file_id).text.splitlines()]
    errors = [orjson.loads(x) for x in sdk.files.content(batch.error_file_id).text.splitlines()]
    for item in output + errors:
        completion = ChatCompletion.model_validate(item["response"]["body"])  # the kept answer parses too
        assert completion.usage.total_tokens > 0
    [error] = errors
    assert BatchError.model_validate(error["error"]).code == "invalid_output"
    assert error["response"]["body"]["choices"][0]["finish_reason"] == "length"
    assert error["response"]["body"]["openrelay"]["reasks"] == 1
