"""POST /v1/batches refuses bad requests with a 400 envelope (never a 500)."""

import orjson
import pytest

from batches.models import Batch
from batches.validation.jsonl import MAX_RECORDS
from files.models import File
from tests.batches_api_tests.helpers import chat_line, create, error_of, jsonl, upload


def _file(alice):
    return upload(alice, jsonl(chat_line("a"))).public_id


@pytest.mark.django_db
class TestCreateParams:
    @pytest.mark.parametrize(
        "params, param, code, message",
        [
            (
                {"endpoint": "/v1/invalid/endpoint"},
                "endpoint",
                "invalid_value",
                "Invalid value for 'endpoint': '/v1/invalid/endpoint'. Supported values are: '/v1/chat/completions', "
                "'/v1/completions', '/v1/embeddings', '/v1/responses', '/v1/moderations', and '/v1/messages'.",
            ),
            ({"endpoint": None}, "endpoint", "missing_required_parameter", "Missing required parameter: 'endpoint'."),
            ({"endpoint": ["/v1/chat/completions"]}, "endpoint", "invalid_value", "Supported values"),
            ({"completion_window": "48h"}, "completion_window", "invalid_value", "'24h'"),
            ({"completion_window": ""}, "completion_window", "invalid_value", "'24h'"),
            ({"completion_window": None}, "completion_window", "missing_required_parameter", "completion_window"),
            (
                {"metadata": {"tags": ["a"]}},
                "metadata.tags",
                "invalid_type",
                "Invalid type for 'metadata.tags': expected a string, but got an array instead.",
            ),
            ({"metadata": {"n": 1}}, "metadata.n", "invalid_type", "but got an integer instead"),
            ({"metadata": "x"}, "metadata", "invalid_type", "expected an object"),
            ({"metadata": {str(i): "v" for i in range(17)}}, "metadata", "invalid_value", "at most 16"),
            ({"metadata": {"k" * 65: "v"}}, "metadata", "invalid_value", "at most 64"),
            ({"metadata": {"k": "v" * 513}}, "metadata.k", "invalid_value", "maximum length 512"),
            (
                {"output_expires_after": {"anchor": "created_at", "seconds": 3599}},
                "output_expires_after.seconds",
                "invalid_value",
                "between 3600 and 2592000",
            ),
            (
                {"output_expires_after": {"anchor": "created_at", "seconds": 2592001}},
                "output_expires_after.seconds",
                "invalid_value",
                "2592001",
            ),
            (
                {"output_expires_after": {"anchor": "created_at", "seconds": "7200"}},
                "output_expires_after.seconds",
                "invalid_type",
                "expected an integer",
            ),
            (
                {"output_expires_after": {"anchor": "created_at", "seconds": True}},
                "output_expires_after.seconds",
                "invalid_type",
                "boolean",
            ),
            (
                {"output_expires_after": {"anchor": "completed_at", "seconds": 7200}},
                "output_expires_after.anchor",
                "invalid_value",
                "'created_at'",
            ),
            (
                {"output_expires_after": {"seconds": 7200}},
                "output_expires_after.anchor",
                "missing_required_parameter",
                "anchor",
            ),
            (
                {"output_expires_after": {"anchor": "created_at"}},
                "output_expires_after.seconds",
                "missing_required_parameter",
                "seconds",
            ),
            (
                {"output_expires_after": {"anchor": "created_at", "seconds": 7200, "x": 1}},
                "output_expires_after.x",
                "unknown_parameter",
                "x",
            ),
            ({"output_expires_after": 7200}, "output_expires_after", "invalid_type", "expected an object"),
            ({"priority": "urgent"}, "priority", "invalid_value", "'standard' and 'expedited'"),
            ({"model": "x"}, "model", "unknown_parameter", "Unrecognized request argument supplied: model"),
        ],
    )
    def test_it_refuses_bad_parameters(self, alice, gemma, params, param, code, message):
        error = error_of(create(alice, input_file_id=_file(alice), **params))
        assert (error["param"], error["code"], error["type"]) == (param, code, "invalid_request_error")
        assert message in error["message"]
        assert not Batch.objects.exists()

    def test_it_accepts_null_metadata_and_16_pairs(self, alice, gemma):
        assert create(alice, input_file_id=_file(alice), metadata=None).json()["metadata"] is None
        pairs = {f"k{i}": "v" * 512 for i in range(16)}
        assert create(alice, input_file_id=_file(alice), metadata=pairs).json()["metadata"] == pairs

    def test_it_needs_exactly_one_input(self, alice, gemma):
        error = error_of(create(alice))
        assert (error["param"], error["code"]) == ("input_file_id", "missing_required_parameter")
        error = error_of(create(alice, input_file_id=_file(alice), requests=[chat_line("a")]))
        assert (error["param"], error["code"]) == ("requests", "invalid_value")
        error = error_of(create(alice, input_file_id=5))
        assert (error["param"], error["code"]) == ("input_file_id", "invalid_type")
        error = error_of(create(alice, requests={"custom_id": "a"}))
        assert (error["param"], error["code"]) == ("requests", "invalid_type")

    def test_it_refuses_unknown_expired_and_output_files(self, alice, gemma):
        from datetime import timedelta

        from django.utils import timezone

        error = error_of(create(alice, input_file_id="file-nope"))
        assert error["param"] == "input_file_id"
        assert error["message"] == "Cannot find file file-nope, or organization 'alice-org' does not have access to it."
        output = upload(alice, jsonl(chat_line("a")), purpose="batch_output")
        error = error_of(create(alice, input_file_id=output.public_id))
        assert (error["param"], error["code"]) == ("input_file_id", "invalid_value")
        assert "purpose 'batch'" in error["message"]
        expired = upload(alice, jsonl(chat_line("a")), expires_at=timezone.now() - timedelta(seconds=1))
        error = error_of(create(alice, input_file_id=expired.public_id))
        assert "expired" in error["message"] and error["param"] == "input_file_id"

    def test_it_refuses_a_malformed_json_body(self, alice):
        response = alice.client.post("/v1/batches", data=b'{"endpoint": ', content_type="application/json")
        error = error_of(response)
        assert (error["type"], error["code"]) == ("invalid_request_error", "parse_error")
        assert "could not parse the JSON body" in error["message"] and "line 1, column 14" in error["message"]

    def test_it_refuses_a_body_nested_too_deep(self, alice):
        payload = b'{"metadata": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        response = alice.client.post("/v1/batches", data=payload, content_type="application/json")
        assert "depth limit exceeded" in error_of(response)["message"]

    @pytest.mark.parametrize("payload", [b"[1, 2]", b'"text"', b"null", b"3"])
    def test_it_refuses_a_body_that_is_not_an_object(self, alice, payload):
        response = alice.client.post("/v1/batches", data=payload, content_type="application/json")
        error = error_of(response)
        assert error["code"] == "invalid_type"
        assert "must be a JSON object" in error["message"]

    def test_it_refuses_form_bodies(self, alice):
        response = alice.client.post("/v1/batches", data="endpoint=x", content_type="application/x-www-form-urlencoded")
        error = error_of(response, 415)
        assert (error["type"], error["code"]) == ("invalid_request_error", "unsupported_media_type")
        assert "Content-Type: application/json" in error["message"]


@pytest.mark.django_db
class TestFileLevelRefusals:
    def test_it_refuses_an_empty_file(self, alice, gemma):
        for content in (b"", b"\n\n  \n\r\n"):
            error = error_of(create(alice, input_file_id=upload(alice, content).public_id))
            assert (error["code"], error["param"]) == ("empty_file", "input_file_id")
        assert not Batch.objects.exists()

    def test_it_refuses_empty_inline_requests_without_a_file(self, alice, gemma):
        error = error_of(create(alice, requests=[]))
        assert (error["code"], error["param"]) == ("empty_file", "requests")
        assert not File.objects.exists()

    def test_it_refuses_more_than_50000_records(self, alice, gemma):
        line = orjson.dumps(chat_line("a")) + b"\n"
        content = line * (MAX_RECORDS + 1)
        error = error_of(create(alice, input_file_id=upload(alice, content).public_id))
        assert (error["code"], error["param"]) == ("too_many_requests", "input_file_id")
        assert "50,000" in error["message"]
        assert not Batch.objects.exists()

    def test_it_counts_only_non_blank_lines_toward_the_limit(self, alice, gemma):
        lines = [orjson.dumps(chat_line(f"r{i}")) + b"\n\n" for i in range(MAX_RECORDS)]
        response = create(alice, input_file_id=upload(alice, b"".join(lines)).public_id)
        assert response.status_code == 200
        assert response.json()["request_counts"]["total"] == MAX_RECORDS

    def test_it_refuses_too_many_inline_requests(self, alice, gemma):
        error = error_of(create(alice, requests=[{}] * (MAX_RECORDS + 1)))
        assert (error["code"], error["param"]) == ("too_many_requests", "requests")
        assert not File.objects.exists()
