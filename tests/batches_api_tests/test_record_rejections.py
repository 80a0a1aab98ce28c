"""Per-record validation at create: every rejection code, its line, param and message."""

import copy

import pytest

from batches.models import Record
from tests.batches_api_tests.helpers import GEMMA, QWEN, chat_line, create, jsonl, upload

GOOD = chat_line("good")


def _with(custom_id="r", drop=(), body_drop=(), **changes):
    """A chat line with top-level `changes` (body.* keys via body_<key>) and dropped keys."""
    record = copy.deepcopy(chat_line(custom_id))
    for key, value in changes.items():
        if key.startswith("body_"):
            record["body"][key[5:]] = value
        else:
            record[key] = value
    for key in drop:
        record.pop(key)
    for key in body_drop:
        record["body"].pop(key)
    return record


TOOL = {"url": "https://tools.example.com/run"}

# (line, code, param, message or a part of it)
ALONE = {
    "bad json": ("{not json", "invalid_json_line", None, "This line is not parseable as valid JSON."),
    "json array": ("[1, 2]", "invalid_json_line", None, "not a JSON object"),
    "invalid utf-8": (b'{"custom_id": "\xff"}', "invalid_json_line", None, "not parseable"),
    "no custom_id": (
        _with(drop=["custom_id"]),
        "missing_required_parameter",
        "custom_id",
        "Missing required parameter: 'custom_id'.",
    ),
    "null custom_id": (_with(custom_id=None), "missing_required_parameter", "custom_id", "'custom_id'"),
    "no method": (
        _with(drop=["method"]),
        "missing_required_parameter",
        "method",
        "Missing required parameter: 'method'.",
    ),
    "no url": (_with(drop=["url"]), "missing_required_parameter", "url", "Missing required parameter: 'url'."),
    "no body": (_with(drop=["body"]), "missing_required_parameter", "body", "Missing required parameter: 'body'."),
    "empty custom_id": (_with(custom_id=""), "invalid_request", "custom_id", "non-empty string"),
    "numeric custom_id": (_with(custom_id=7), "invalid_request", "custom_id", "non-empty string"),
    "long custom_id": (_with(custom_id="x" * 513), "invalid_request", "custom_id", "at most 512"),
    "GET": (_with(method="GET"), "invalid_request", "method", "Only 'POST'"),
    "other url": (
        _with(url="/v1/embeddings"),
        "invalid_url",
        "url",
        "The URL provided for this request does not match the batch endpoint.",
    ),
    "body not object": (_with(body="hello"), "invalid_request", "body", "expected an object"),
    "no model": (_with(body_drop=["model"]), "invalid_request", "body.model", "Model parameter is required."),
    "model not string": (_with(body_model=5), "invalid_request", "body.model", "expected a string"),
    "no messages": (
        _with(body_drop=["messages"]),
        "invalid_request",
        "body.messages",
        "Messages parameter is required.",
    ),
    "empty messages": (_with(body_messages=[]), "invalid_request", "body.messages", "Messages parameter is required."),
    "stream": (
        _with(body_stream=True),
        "streaming_unsupported",
        "body.stream",
        "Chat Completions: Streaming is not supported in the Batch API.",
    ),
    "unknown model": (
        _with(body_model="nope/x"),
        "model_not_found",
        "body.model",
        "The provided model 'nope/x' is not supported by the Batch API.",
    ),
    "bare tool_config": (
        _with(body_tool_config=TOOL),
        "tool_config_moved",
        "body.tool_config",
        "openrelay.tool_config",
    ),
    "bad tool_config": (
        _with(body_openrelay={"tool_config": {"url": "ftp://x"}}),
        "invalid_tool_config",
        "body.openrelay.tool_config.url",
        "http(s) URL",
    ),
    "negative max_rounds": (
        _with(body_openrelay={"tool_config": {**TOOL, "max_rounds": -1}}),
        "invalid_tool_config",
        "body.openrelay.tool_config.max_rounds",
        "non-negative",
    ),
    "both extensions": (
        _with(body_openrelay={"tool_config": TOOL, "workflow": TOOL}),
        "invalid_workflow",
        "body.openrelay",
        "not both",
    ),
    "workflow off": (
        _with(body_openrelay={"workflow": TOOL}),
        "workflow_not_enabled",
        "body.openrelay.workflow",
        "not enabled",
    ),
    "openrelay not object": (_with(body_openrelay=[1]), "invalid_request", "body.openrelay", "expected an object"),
    "unknown openrelay key": (
        _with(body_openrelay={"tool_rounds": 2}),
        "invalid_request",
        "body.openrelay.tool_rounds",
        "Unknown parameter",
    ),
}


@pytest.mark.django_db
class TestRecordRejections:
    @pytest.mark.parametrize("name", list(ALONE))
    def test_it_rejects_each_problem_alone(self, alice, gemma, name):
        line, code, param, message = ALONE[name]
        body = create(alice, input_file_id=upload(alice, jsonl(line)).public_id).json()
        assert body["status"] == "failed"
        [error] = body["errors"]["data"]
        assert (error["code"], error["param"], error["line"]) == (code, param, 1)
        assert message in error["message"]

    def test_it_rejects_a_second_model(self, alice, gemma, qwen):
        body = create(alice, requests=[GOOD, chat_line("q", model=QWEN)]).json()
        assert body["errors"]["data"] == [
            {
                "code": "model_mismatch",
                "param": "body.model",
                "line": 2,
                "message": f"The provided model '{QWEN}' does not match this batch's model '{GEMMA}'; "
                "a batch runs a single model.",
            }
        ]
        assert body["model"] == GEMMA

    def test_it_rejects_every_duplicate_after_the_first(self, alice, gemma):
        body = create(alice, requests=[chat_line("a"), chat_line("a"), chat_line("b"), chat_line("a")]).json()
        assert [(e["code"], e["param"], e["line"]) for e in body["errors"]["data"]] == [
            ("duplicate_custom_id", "custom_id", 2),
            ("duplicate_custom_id", "custom_id", 4),
        ]
        assert "line 1" in body["errors"]["data"][0]["message"]
        assert body["request_counts"]["total"] == 2

    def test_it_checks_completions_and_embeddings_bodies(self, alice, gemma):
        cases = [
            ("/v1/completions", {}, "body.prompt", "Prompt parameter is required."),
            ("/v1/completions", {"prompt": "", "stream": True}, "body.prompt", "Prompt parameter is required."),
            ("/v1/embeddings", {"input": []}, "body.input", "Input parameter is required."),
        ]
        for endpoint, fields, param, message in cases:
            line = {"custom_id": "x", "method": "POST", "url": endpoint, "body": {"model": GEMMA, **fields}}
            body = create(alice, endpoint=endpoint, requests=[line]).json()
            assert [(e["code"], e["param"], e["message"]) for e in body["errors"]["data"]] == [
                ("invalid_request", param, message)
            ]
        line = {
            "custom_id": "x",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": GEMMA, "prompt": "hi", "stream": True},
        }
        error = create(alice, endpoint="/v1/completions", requests=[line]).json()["errors"]["data"][0]
        assert error["message"] == "Completions: Streaming is not supported in the Batch API."

    def test_it_accepts_workflows_for_enabled_organizations(self, alice, gemma):
        alice.org.workflows_enabled = True
        alice.org.save(update_fields=["workflows_enabled"])
        body = create(alice, requests=[_with(body_openrelay={"workflow": {**TOOL, "max_steps": 500}})]).json()
        assert body["errors"] is None
        bad = create(alice, requests=[_with(body_openrelay={"workflow": {"max_steps": 2}})]).json()
        assert bad["errors"]["data"][0]["code"] == "invalid_workflow"
        assert bad["errors"]["data"][0]["param"] == "body.openrelay.workflow.url"

    def test_it_accepts_tool_config_only_on_chat(self, alice, gemma):
        ok = create(alice, requests=[_with(body_openrelay={"tool_config": TOOL}, body_tools=[])]).json()
        assert ok["errors"] is None
        line = {
            "custom_id": "x",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": GEMMA, "input": "a", "openrelay": {"tool_config": TOOL}},
        }
        error = create(alice, endpoint="/v1/embeddings", requests=[line]).json()["errors"]["data"][0]
        assert (error["code"], error["param"]) == ("invalid_tool_config", "body.openrelay.tool_config")

    def test_it_accepts_stream_false_and_an_empty_openrelay_object(self, alice, gemma):
        body = create(alice, requests=[_with(body_stream=False, body_openrelay={})]).json()
        assert body["errors"] is None

    def test_it_lists_every_rejection_of_a_mixed_file_by_line(self, alice, gemma, qwen):
        lines = [
            GOOD,  # 1 accepted
            "",  # 2 blank
            "{oops",  # 3
            _with("m", drop=["method"]),  # 4
            _with("u", url="/v1/completions"),  # 5
            _with("s", body_stream=True),  # 6
            _with("nf", body_model="nope"),  # 7
            _with("mm", body_model=QWEN),  # 8
            _with("good"),  # 9 duplicate of line 1
            _with("tc", body_openrelay={"tool_config": {"url": 1}}),  # 10
            _with("tm", body_tool_config=TOOL),  # 11
            _with("wf", body_openrelay={"workflow": TOOL}),  # 12
            "   ",  # 13 blank
            _with("ok2"),  # 14 accepted
        ]
        body = create(alice, input_file_id=upload(alice, jsonl(*lines)).public_id).json()
        assert [(e["line"], e["code"], e["param"]) for e in body["errors"]["data"]] == [
            (3, "invalid_json_line", None),
            (4, "missing_required_parameter", "method"),
            (5, "invalid_url", "url"),
            (6, "streaming_unsupported", "body.stream"),
            (7, "model_not_found", "body.model"),
            (8, "model_mismatch", "body.model"),
            (9, "duplicate_custom_id", "custom_id"),
            (10, "invalid_tool_config", "body.openrelay.tool_config.url"),
            (11, "tool_config_moved", "body.tool_config"),
            (12, "workflow_not_enabled", "body.openrelay.workflow"),
        ]
        assert body["status"] == "validating"
        assert body["request_counts"]["total"] == 2
        records = Record.objects.filter(batch__public_id=body["id"]).order_by("line")
        assert list(records.values_list("line", flat=True)) == [1, 14]


@pytest.mark.django_db
class TestPrecedence:
    """A line with several problems gets the first in a fixed order."""

    CASES = [
        (_with(drop=["method"], url="/v1/x"), "missing_required_parameter"),
        (_with(custom_id="", method="GET"), "invalid_request"),
        (_with(method="GET", url="/v1/x"), "invalid_request"),
        (_with(url="/v1/x", body_stream=True), "invalid_url"),
        (_with(body_messages=[], body_stream=True), "invalid_request"),
        (_with(body_stream=True, body_model="nope"), "streaming_unsupported"),
        (_with(body_model="nope", body_tool_config=TOOL), "model_not_found"),
        (_with("good", body_tool_config=TOOL), "tool_config_moved"),
    ]

    @pytest.mark.parametrize("index", range(len(CASES)))
    def test_it_reports_the_first_problem(self, alice, gemma, index):
        line, code = self.CASES[index]
        body = create(alice, requests=[GOOD, line]).json()
        assert [e["code"] for e in body["errors"]["data"]] == [code]

    def test_it_lets_only_accepted_records_claim_a_custom_id(self, alice, gemma):
        body = create(alice, requests=[_with("a", body_stream=True), _with("a"), _with("a")]).json()
        assert [(e["line"], e["code"]) for e in body["errors"]["data"]] == [
            (1, "streaming_unsupported"),
            (3, "duplicate_custom_id"),
        ]

    def test_it_takes_the_model_of_the_first_accepted_record(self, alice, gemma, qwen):
        body = create(
            alice, requests=[_with("a", body_model=QWEN, body_stream=True), _with("b"), _with("c", body_model=QWEN)]
        ).json()
        assert body["model"] == GEMMA
        assert [(e["line"], e["code"]) for e in body["errors"]["data"]] == [
            (1, "streaming_unsupported"),
            (3, "model_mismatch"),
        ]
