"""Every record's body checked at create against its endpoint's published request type (issue 50):
what OpenAI or Anthropic would answer with a 400 is refused with its line and param, the valid
lines run, and fields a schema does not name pass unchanged (a local server reads them)."""

import pytest

from batches.models import Record
from tests.batches_api_tests.helpers import GEMMA, chat_line, create, jsonl, upload

USER = [{"role": "user", "content": "hi"}]

# The cases: (body fields, code, param, a part of the message).
CHAT_REFUSED = [
    # openbatch's parse(): the Responses API's shape written into a chat body.
    (
        {"response_format": {"format": {"type": "json_schema", "schema": {"type": "object"}}}},
        "missing_required_parameter",
        "body.response_format.type",
        "Missing required parameter: 'body.response_format.type'.",
    ),
    (
        {"response_format": {"type": "banana"}},
        "invalid_value",
        "body.response_format.type",
        "'banana'. Supported values are: 'text', 'json_schema', and 'json_object'.",
    ),
    (
        {"temperature": "hot"},
        "invalid_type",
        "body.temperature",
        "Invalid type for 'body.temperature': expected a number, but got a string instead.",
    ),
    ({"n": "two"}, "invalid_type", "body.n", "expected an integer, but got a string instead."),
    ({"n": "2"}, "invalid_type", "body.n", "expected an integer"),
    (
        {"messages": [{"role": "wizard", "content": "hi"}]},
        "invalid_value",
        "body.messages.0.role",
        "Invalid value for 'body.messages.0.role': 'wizard'. Supported values are: 'developer', 'system', 'user'",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
        "invalid_type",
        "body.messages.0.content.0.text",
        "expected a string, but got an integer instead.",
    ),
    (
        {"messages": [{"role": "user", "content": 5}]},
        "invalid_type",
        "body.messages.0.content",
        "expected a string or an array, but got an integer instead.",
    ),
    (
        {"tools": [{"type": "function", "function": {"name": 5}}]},
        "invalid_type",
        "body.tools.0.function.name",
        "expected a string",
    ),
    ({"logprobs": "yes"}, "invalid_type", "body.logprobs", "expected a boolean"),
]


GOOD = {
    "/v1/completions": {"prompt": "ok"},
    "/v1/embeddings": {"input": "ok"},
    "/v1/moderations": {"input": "ok"},
    "/v1/responses": {"input": "ok"},
    "/v1/messages": {"max_tokens": 5, "messages": USER},
}


def _line(custom_id, url, body):
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": {"model": GEMMA, **body}}


@pytest.mark.django_db
class TestSchemaChecks:
    def test_it_refuses_each_chat_body_a_server_refuses_and_runs_the_valid_lines(self, alice, gemma):
        lines = [chat_line("good-1")]
        for index, (fields, *_) in enumerate(CHAT_REFUSED):
            lines.append(_line(f"bad-{index}", "/v1/chat/completions", {"messages": USER, **fields}))
        lines.append(chat_line("good-2"))
        body = create(alice, requests=lines).json()
        got = [(e["line"], e["code"], e["param"], e["message"]) for e in body["errors"]["data"]]
        assert [(line, code, param) for line, code, param, _ in got] == [
            (index + 2, code, param) for index, (_, code, param, _) in enumerate(CHAT_REFUSED)
        ]
        for (*_, message), (*_, part) in zip(got, CHAT_REFUSED):
            assert part in message
        assert body["request_counts"]["total"] == 2
        assert set(Record.objects.filter(batch__public_id=body["id"]).values_list("custom_id", flat=True)) == {
            "good-1",
            "good-2",
        }

    @pytest.mark.parametrize(
        ("endpoint", "fields", "code", "param"),
        [
            ("/v1/completions", {"prompt": "hi", "n": "two"}, "invalid_type", "body.n"),
            ("/v1/completions", {"prompt": "hi", "temperature": "hot"}, "invalid_type", "body.temperature"),
            ("/v1/embeddings", {"input": "hi", "dimensions": "8"}, "invalid_type", "body.dimensions"),
            ("/v1/embeddings", {"input": "hi", "encoding_format": "hex"}, "invalid_value", "body.encoding_format"),
            ("/v1/moderations", {"input": [{"type": "banana"}]}, "invalid_type", "body.input.0"),
            (
                "/v1/responses",
                {"input": "hi", "text": {"format": {"type": "banana"}}},
                "invalid_value",
                "body.text.format.type",
            ),
            ("/v1/responses", {"input": [{"role": "wizard", "content": "x"}]}, "invalid_value", "body.input.0.role"),
            ("/v1/responses", {"input": "hi", "temperature": "hot"}, "invalid_type", "body.temperature"),
            (
                "/v1/messages",
                {"max_tokens": 5, "messages": [{"role": "wizard", "content": "x"}]},
                "invalid_value",
                "body.messages.0.role",
            ),
            (
                "/v1/messages",
                {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "banana"}]}]},
                "invalid_value",
                "body.messages.0.content.0.type",
            ),
        ],
    )
    def test_it_refuses_the_same_kinds_on_the_other_endpoints(self, alice, gemma, endpoint, fields, code, param):
        good = GOOD[endpoint]
        lines = [_line("good", endpoint, good), _line("bad", endpoint, fields)]
        body = create(alice, endpoint=endpoint, requests=lines).json()
        [error] = body["errors"]["data"]
        assert (error["line"], error["code"], error["param"]) == (2, code, param)
        assert param in error["message"]
        assert body["request_counts"]["total"] == 1

    def test_fields_no_schema_names_pass_and_the_body_is_stored_unchanged(self, alice, gemma):
        extras = {
            "top_k": 20,
            "chat_template_kwargs": {"enable_thinking": False},
            "guided_json": {"type": "object"},
            "temperature": None,
            "messages": [{"role": "user", "content": "hi", "cache_hint": "x"}],
        }
        line = _line("vllm", "/v1/chat/completions", extras)
        body = create(alice, input_file_id=upload(alice, jsonl(line)).public_id).json()
        assert body["errors"] is None
        assert body["request_counts"]["total"] == 1
