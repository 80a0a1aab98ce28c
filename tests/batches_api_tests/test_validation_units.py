"""The pure parts of batches.validation: normalizers the engine shares, the line reader, the scan."""

import io

import orjson
import pytest

from batches.validation.extensions import RecordRejected, normalize_tool_config, normalize_workflow
from batches.validation.jsonl import FileRejected, iter_lines, scan
from batches.validation.records import RecordChecker

URL = "https://tools.example.com/run"


def _rejects(func, value, code, param):
    with pytest.raises(RecordRejected) as caught:
        func(value)
    assert (caught.value.code, caught.value.param) == (code, param)
    return caught.value


class TestToolConfig:
    def test_it_fills_defaults(self):
        assert normalize_tool_config({"url": URL}) == {
            "type": "http",
            "url": URL,
            "authorization": None,
            "context": None,
            "max_rounds": 8,
            "timeout_ms": 30000,
        }

    def test_it_keeps_given_values(self):
        config = {
            "type": "mcp",
            "url": URL,
            "authorization": "Bearer t",
            "context": {"a": [1]},
            "max_rounds": 3,
            "timeout_ms": 500,
        }
        assert normalize_tool_config(config) == config

    @pytest.mark.parametrize(
        "given, expected",
        [
            ({"max_rounds": 0, "timeout_ms": 0}, (8, 30000)),
            ({"max_rounds": None, "timeout_ms": None}, (8, 30000)),
            ({"max_rounds": 17, "timeout_ms": 120001}, (16, 120000)),
            ({"max_rounds": 10**12, "timeout_ms": 5.0}, (16, 5)),
            ({"max_rounds": 16, "timeout_ms": 120000}, (16, 120000)),
        ],
    )
    def test_it_takes_defaults_and_clamps(self, given, expected):
        config = normalize_tool_config({"url": URL, **given})
        assert (config["max_rounds"], config["timeout_ms"]) == expected

    @pytest.mark.parametrize(
        "given, param",
        [
            ({"max_rounds": -1}, "max_rounds"),
            ({"max_rounds": True}, "max_rounds"),
            ({"max_rounds": 2.5}, "max_rounds"),
            ({"max_rounds": "8"}, "max_rounds"),
            ({"timeout_ms": -5}, "timeout_ms"),
            ({"timeout_ms": [1]}, "timeout_ms"),
            ({"type": "grpc"}, "type"),
            ({"authorization": 5}, "authorization"),
            ({"retries": 3}, "retries"),
            ({"url": None}, "url"),
            ({"url": 7}, "url"),
            ({"url": "ftp://tools.example.com"}, "url"),
            ({"url": "https://"}, "url"),
            ({"url": "/relative"}, "url"),
            ({"url": "https://[::1"}, "url"),
            ({"url": "https://ex ample.com"}, "url"),
        ],
    )
    def test_it_rejects(self, given, param):
        _rejects(
            normalize_tool_config, {"url": URL, **given}, "invalid_tool_config", f"body.openrelay.tool_config.{param}"
        )

    def test_it_rejects_a_non_object(self):
        _rejects(normalize_tool_config, "https://x", "invalid_tool_config", "body.openrelay.tool_config")

    def test_it_does_not_resolve_the_host(self):
        # Guarding happens when the URL is called; create only checks syntax.
        assert normalize_tool_config({"url": "http://127.0.0.1:9/x"})["url"] == "http://127.0.0.1:9/x"


class TestWorkflow:
    def test_it_fills_defaults(self):
        assert normalize_workflow({"url": URL}) == {
            "url": URL,
            "authorization": None,
            "context": None,
            "max_steps": 8,
            "max_requests": 64,
            "max_tokens": 1_000_000,
            "timeout_ms": 30000,
        }

    def test_it_clamps_to_the_caps(self):
        workflow = normalize_workflow(
            {
                "url": URL,
                "max_steps": 65,
                "max_requests": 5000,
                "max_tokens": 10**9,
                "timeout_ms": 10**6,
                "context": {"invoice": 42},
            }
        )
        assert (workflow["max_steps"], workflow["max_requests"], workflow["max_tokens"], workflow["timeout_ms"]) == (
            64,
            1024,
            10_000_000,
            120_000,
        )
        assert workflow["context"] == {"invoice": 42}

    @pytest.mark.parametrize(
        "given, param",
        [
            ({"max_steps": -1}, "body.openrelay.workflow.max_steps"),
            ({"max_requests": -2}, "body.openrelay.workflow.max_requests"),
            ({"max_tokens": False}, "body.openrelay.workflow.max_tokens"),
            ({"timeout_ms": -1}, "body.openrelay.workflow.timeout_ms"),
            ({"url": None}, "body.openrelay.workflow.url"),
            ({"max_rounds": 2}, "body.openrelay.workflow.max_rounds"),
        ],
    )
    def test_it_rejects(self, given, param):
        _rejects(normalize_workflow, {"url": URL, **given}, "invalid_workflow", param)

    def test_it_rejects_a_non_object(self):
        _rejects(normalize_workflow, [URL], "invalid_workflow", "body.openrelay.workflow")


class TestIterLines:
    CONTENT = b'{"a": 1}\n\n{"b": 22}\r\n   \n{"c": 333}'

    @pytest.mark.parametrize("chunk_size", [1, 2, 3, 7, 64, 1 << 20])
    def test_it_gives_offsets_across_chunk_boundaries(self, chunk_size):
        lines = list(iter_lines(io.BytesIO(self.CONTENT), chunk_size=chunk_size))
        assert [raw for _, raw in lines] == [b'{"a": 1}', b"", b'{"b": 22}\r', b"   ", b'{"c": 333}']
        for offset, raw in lines:
            assert self.CONTENT[offset : offset + len(raw)] == raw

    def test_it_handles_a_trailing_newline_and_empty_input(self):
        assert list(iter_lines(io.BytesIO(b"x\n"))) == [(0, b"x")]
        assert list(iter_lines(io.BytesIO(b""))) == []


class _CountingStream(io.BytesIO):
    def __init__(self, content):
        super().__init__(content)
        self.read_bytes = 0

    def read(self, size=-1):
        chunk = super().read(size)
        self.read_bytes += len(chunk)
        return chunk


def _checker():
    return RecordChecker("/v1/chat/completions", models={"m": 1}, workflows_enabled=False)


class TestScan:
    def test_it_stops_reading_once_past_the_limit(self):
        line = orjson.dumps({"custom_id": "a"}) + b"\n"
        stream = _CountingStream(line * 100_000)
        with pytest.raises(FileRejected) as caught:
            scan(stream, _checker(), max_records=10)
        assert caught.value.code == "too_many_requests"
        assert stream.read_bytes < len(line) * 100_000

    def test_it_refuses_blank_only_input(self):
        with pytest.raises(FileRejected) as caught:
            scan(io.BytesIO(b"\n \n\t\n"), _checker())
        assert caught.value.code == "empty_file"

    def test_it_collects_columns_for_accepted_records(self):
        good = {
            "custom_id": "a",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [{"role": "user", "content": "x"}]},
        }
        content = orjson.dumps(good) + b"\nnope\n"
        result = scan(io.BytesIO(content), _checker())
        assert list(result.rows()) == [(1, "a", 0, len(orjson.dumps(good)))]
        assert result.errors == [
            {
                "code": "invalid_json_line",
                "message": "This line is not parseable as valid JSON.",
                "param": None,
                "line": 2,
            }
        ]


class TestRequiredCap:
    """A Messages record must set max_tokens (Anthropic's wording); a chat record need not."""

    @staticmethod
    def _record(url, body):
        return {"custom_id": "a", "method": "POST", "url": url, "body": {"model": "m", **body}}

    def test_it_rejects_a_messages_record_without_max_tokens(self):
        checker = RecordChecker("/v1/messages", models={"m": 1}, workflows_enabled=False)
        record = self._record("/v1/messages", {"messages": [{"role": "user", "content": "x"}]})
        rejected = _rejects(lambda obj: checker.check(obj, 1), record, "missing_required_parameter", "body.max_tokens")
        assert rejected.message == "max_tokens: Field required"

    @pytest.mark.parametrize("value", [0, True, "64", 1.5])
    def test_it_rejects_a_max_tokens_that_is_no_count(self, value):
        checker = RecordChecker("/v1/messages", models={"m": 1}, workflows_enabled=False)
        body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": value}
        rejected = _rejects(
            lambda obj: checker.check(obj, 1), self._record("/v1/messages", body), "invalid_request", "body.max_tokens"
        )
        assert rejected.message.startswith("max_tokens: expected an integer of at least 1, but got ")

    def test_it_takes_a_messages_record_with_max_tokens_and_a_chat_record_without(self):
        messages = RecordChecker("/v1/messages", models={"m": 1}, workflows_enabled=False)
        body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 16}
        assert messages.check(self._record("/v1/messages", body), 1) == "a"
        chat = _checker()
        assert (
            chat.check(self._record("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}), 1) == "a"
        )
