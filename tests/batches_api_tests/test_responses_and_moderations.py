"""/v1/responses and /v1/moderations batches: what create accepts and rejects, per record."""

import pytest

from batches.validation.params import ENDPOINTS
from tests.batches_api_tests.helpers import GEMMA, create, jsonl, upload

RESPONSES, MODERATIONS = "/v1/responses", "/v1/moderations"


def line(custom_id, url, **body):
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": {"model": GEMMA, **body}}


def rejections(alice, endpoint, *records):
    file = upload(alice, jsonl(*records))
    response = create(alice, input_file_id=file.public_id, endpoint=endpoint)
    assert response.status_code == 200, response.content
    batch = response.json()
    return {
        error["line"]: (error["code"], error["param"], error["message"])
        for error in (batch["errors"] or {"data": []})["data"]
    }, batch


def test_both_endpoints_are_accepted_at_create(alice, gemma):
    assert RESPONSES in ENDPOINTS and MODERATIONS in ENDPOINTS
    for endpoint, body in ((RESPONSES, {"input": "Say hi."}), (MODERATIONS, {"input": ["one", "two"]})):
        errors, batch = rejections(alice, endpoint, line("a", endpoint, **body))
        assert errors == {} and batch["status"] != "failed" and batch["endpoint"] == endpoint


def test_a_responses_record_may_give_input_as_items(alice, gemma):
    items = [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]
    errors, _ = rejections(
        alice,
        RESPONSES,
        line(
            "a",
            RESPONSES,
            input=items,
            instructions="Be brief.",
            reasoning={"effort": "low"},
            max_output_tokens=50,
            store=False,
        ),
    )
    assert errors == {}


@pytest.mark.parametrize(
    "body, code, param, message",
    [
        ({}, "invalid_request", "body.input", "Input parameter is required."),
        ({"input": ""}, "invalid_request", "body.input", "Input parameter is required."),
        ({"input": []}, "invalid_request", "body.input", "Input parameter is required."),
        (
            {"input": "x", "stream": True},
            "streaming_unsupported",
            "body.stream",
            "Responses: Streaming is not supported in the Batch API.",
        ),
        ({"input": "x", "background": True}, "unsupported_parameter", "body.background", "'background'"),
        (
            {"input": "x", "previous_response_id": "resp_1"},
            "unsupported_parameter",
            "body.previous_response_id",
            "send the whole conversation in 'input'",
        ),
        ({"input": "x", "conversation": "conv_1"}, "unsupported_parameter", "body.conversation", "'conversation'"),
        (
            {"input": "x", "openrelay": {"tool_config": {"url": "https://t.example/run"}}},
            "invalid_tool_config",
            "body.openrelay.tool_config",
            "only supported on /v1/chat/completions",
        ),
    ],
)
def test_a_responses_record_is_rejected_with_a_clear_code(alice, gemma, body, code, param, message):
    errors, _ = rejections(alice, RESPONSES, line("bad", RESPONSES, **body), line("good", RESPONSES, input="ok"))
    assert list(errors) == [1]
    assert errors[1][:2] == (code, param) and message in errors[1][2]


def test_background_false_and_a_null_previous_response_are_fine(alice, gemma):
    errors, _ = rejections(
        alice, RESPONSES, line("a", RESPONSES, input="x", background=False, previous_response_id=None, stream=False)
    )
    assert errors == {}


def test_a_responses_record_without_a_model_is_rejected(alice, gemma):
    record = {"custom_id": "a", "method": "POST", "url": RESPONSES, "body": {"input": "x"}}
    errors, batch = rejections(alice, RESPONSES, record)
    assert errors[1][:2] == ("invalid_request", "body.model") and batch["status"] == "failed"


def test_workflows_stay_chat_only(db):
    from openrelay.core.models import Deployment, Model
    from tests.helpers import make_persona

    carol = make_persona("carol-org", workflows_enabled=True)
    Deployment.objects.create(model=Model.objects.create(name=GEMMA), base_url="http://127.0.0.1:9/v1")
    workflow = {"workflow": {"url": "https://callback.example/next"}}
    for endpoint, body in (
        (RESPONSES, {"input": "x"}),
        (MODERATIONS, {"input": "x"}),
        ("/v1/embeddings", {"input": "x"}),
    ):
        errors, _ = rejections(
            carol, endpoint, line("w", endpoint, openrelay=workflow, **body), line("ok", endpoint, **body)
        )
        assert errors == {
            1: (
                "invalid_workflow",
                "body.openrelay.workflow",
                "'openrelay.workflow' is only supported on /v1/chat/completions.",
            )
        }


@pytest.mark.parametrize(
    "body, code, param",
    [
        ({}, "invalid_request", "body.input"),
        ({"input": "x", "stream": True}, "streaming_unsupported", "body.stream"),
        (
            {"input": "x", "openrelay": {"tool_config": {"url": "https://t.example/run"}}},
            "invalid_tool_config",
            "body.openrelay.tool_config",
        ),
    ],
)
def test_a_moderations_record_is_rejected_with_a_clear_code(alice, gemma, body, code, param):
    errors, _ = rejections(alice, MODERATIONS, line("bad", MODERATIONS, **body), line("good", MODERATIONS, input="ok"))
    assert list(errors) == [1] and errors[1][:2] == (code, param)
