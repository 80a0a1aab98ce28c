"""Limits, each answered in the envelope: JSON body size, line length, nesting depth,
metadata, and the per-organization rate limit on batch creation."""

import io

import orjson
import pytest
from django.core.cache import caches

from batches.validation import jsonl as validation_jsonl
from batches.validation.jsonl import MAX_LINE_BYTES, MAX_NESTING_DEPTH, iter_lines
from batches.validation.records import RecordChecker
from openrelay.core.models import ApiKey
from openrelay.lib.env import ImproperlyConfiguredEnv, envrate, parse_rate
from tests.helpers import make_persona
from tests.reliability_tests.conftest import assert_envelope, create, jsonl, record, upload


def nested(depth, leaf="x"):
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def _raw_nested(depth):
    return b"[" * depth + b"1" + b"]" * depth


# --- JSON request bodies ------------------------------------------------------


def test_a_json_body_over_the_limit_is_413_in_the_envelope(alice, catalog, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 4096
    requests = [record(f"r{i}", "x" * 200) for i in range(40)]
    response = create(alice.client, requests=requests)
    error = assert_envelope(response, 413, "request_too_large")
    assert error["type"] == "invalid_request_error"


def test_a_json_body_just_under_the_limit_is_accepted(alice, catalog, settings):
    body = {"endpoint": "/v1/chat/completions", "completion_window": "24h", "requests": [record("r1")]}
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = len(orjson.dumps(body))
    assert alice.client.post("/v1/batches", orjson.dumps(body), content_type="application/json").status_code == 200


def test_the_json_limit_is_the_documented_10_mb_by_default():
    from django.conf import settings

    assert settings.DATA_UPLOAD_MAX_MEMORY_SIZE == 10 * 1024 * 1024


@pytest.mark.parametrize(
    "body, code",
    [
        (b"{", "parse_error"),
        (b"\xff\xfe", "parse_error"),
        (_raw_nested(5000), "parse_error"),  # beyond orjson's 1024 levels
        (b"[]", "invalid_type"),
        (b"null", "invalid_type"),
    ],
    ids=["truncated", "not-utf8", "too-deep", "array", "null"],
)
def test_unreadable_json_bodies_are_coded_400s(alice, catalog, body, code):
    response = alice.client.post("/v1/batches", body, content_type="application/json")
    assert_envelope(response, 400, code)


@pytest.mark.parametrize("param", ["endpoint", "completion_window", "priority"])
def test_a_deeply_nested_parameter_value_is_a_400_not_a_recursion_error(alice, catalog, param):
    # 1,000 levels parse (orjson allows 1,024) but repr() of them exhausts Python's recursion limit.
    body = {"endpoint": "/v1/chat/completions", "completion_window": "24h", "requests": [record("r1")], param: 0}
    raw = orjson.dumps(body).replace(f'"{param}":0'.encode(), f'"{param}":'.encode() + _raw_nested(1000))
    response = alice.client.post("/v1/batches", raw, content_type="application/json")
    error = assert_envelope(response, 400, "invalid_value")
    assert error["param"] == param and "an array" in error["message"]


def test_inline_requests_too_deep_to_store_are_a_coded_400(alice, catalog):
    body = {"endpoint": "/v1/chat/completions", "completion_window": "24h", "requests": [{**record("r1"), "extra": 0}]}
    raw = orjson.dumps(body).replace(b'"extra":0', b'"extra":' + _raw_nested(600))
    response = alice.client.post("/v1/batches", raw, content_type="application/json")
    assert_envelope(response, 400, "invalid_value")


# --- JSONL line length ----------------------------------------------------------


def test_a_line_over_10_mb_is_rejected_as_line_too_long_and_the_rest_run(alice, catalog):
    long_line = orjson.dumps(record("big", "x" * MAX_LINE_BYTES))
    assert len(long_line) > MAX_LINE_BYTES
    content = jsonl(record("a"), long_line, record("b"))
    file_id = upload(alice.client, content).json()["id"]
    response = create(alice.client, input_file_id=file_id)
    assert response.status_code == 200, response.content[:300]
    batch = response.json()
    assert batch["request_counts"]["total"] == 2
    [error] = batch["errors"]["data"]
    assert error["line"] == 2 and error["code"] == "line_too_long"
    assert "10 MB" in error["message"]


def test_a_first_line_over_the_cap_is_rejected_too(alice, catalog, monkeypatch):
    monkeypatch.setattr(validation_jsonl, "MAX_LINE_BYTES", 1000)
    content = jsonl(record("big", "x" * 1000), record("b"))
    file_id = upload(alice.client, content).json()["id"]
    batch = create(alice.client, input_file_id=file_id).json()
    assert [(e["line"], e["code"]) for e in batch["errors"]["data"]] == [(1, "line_too_long")]
    assert batch["request_counts"]["total"] == 1


@pytest.mark.parametrize("chunk_size", [1, 3, 7, 64, 1 << 20])
def test_iter_lines_cuts_exactly_at_the_cap_whatever_the_chunks(chunk_size):
    content = b"a" * 10 + b"\n" + b"b" * 11 + b"\n" + b"c" * 25 + b"\n" + b"d" * 11
    lines = list(iter_lines(io.BytesIO(content), chunk_size=chunk_size, max_line=10))
    assert lines == [(0, b"a" * 10), (11, None), (23, None), (49, None)]
    # Without a cap nothing changes.
    assert [line for _, line in iter_lines(io.BytesIO(content), chunk_size=chunk_size)] == content.split(b"\n")


def test_a_too_long_line_counts_toward_the_record_limit(alice, catalog, monkeypatch):
    monkeypatch.setattr(validation_jsonl, "MAX_LINE_BYTES", 100)
    monkeypatch.setattr(validation_jsonl, "MAX_RECORDS", 2)
    content = jsonl(record("a"), record("b", "x" * 200), record("c"))
    with pytest.raises(validation_jsonl.FileRejected):
        validation_jsonl.scan(
            io.BytesIO(content),
            RecordChecker("/v1/chat/completions", models={"openrelay/gemma-4-31b": 1}, workflows_enabled=False),
            max_records=2,
        )


# --- nesting depth ---------------------------------------------------------------


@pytest.mark.parametrize("depth", [MAX_NESTING_DEPTH + 1, 300, 1023, 5000])
def test_a_line_nested_too_deep_is_rejected_with_a_code(alice, catalog, depth):
    deep = (
        b'{"custom_id":"deep","method":"POST","url":"/v1/chat/completions","body":{"model":"openrelay/gemma-4-31b",'
        b'"messages":[{"role":"user","content":"x"}],"extra":' + _raw_nested(depth) + b"}}"
    )
    file_id = upload(alice.client, jsonl(record("a"), deep)).json()["id"]
    response = create(alice.client, input_file_id=file_id)
    assert response.status_code == 200, response.content[:300]
    batch = response.json()
    assert [(e["line"], e["code"]) for e in batch["errors"]["data"]] == [(2, "nesting_too_deep")]
    assert batch["request_counts"]["total"] == 1


def test_nesting_at_the_limit_is_accepted_and_can_be_sent(alice, catalog):
    # The line itself is depth 3 (line -> body -> extra) around the nested value.
    line = {**record("ok"), "body": {**record("ok")["body"], "extra": nested(MAX_NESTING_DEPTH - 3)}}
    assert not validation_jsonl._too_deep(orjson.dumps(line), line)
    file_id = upload(alice.client, jsonl(line)).json()["id"]
    batch = create(alice.client, input_file_id=file_id).json()
    assert batch["errors"] is None and batch["request_counts"]["total"] == 1
    # What the worker sends (the body, wrapped a few levels by tool loops and workflows) still serializes.
    orjson.dumps({"a": {"b": {"c": {"d": {"e": {"f": line["body"]}}}}}})


def test_many_brackets_but_shallow_is_fine():
    line = {"body": {"input": [[i] for i in range(1000)]}}
    assert not validation_jsonl._too_deep(orjson.dumps(line), line)


# --- metadata -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "metadata, param",
    [
        ({f"k{i}": "v" for i in range(17)}, "metadata"),
        ({"k" * 65: "v"}, "metadata"),
        ({"k": "v" * 513}, "metadata.k"),
        ({"k": 1}, "metadata.k"),
        ({"k": {"nested": "no"}}, "metadata.k"),
        ({"k": None}, "metadata.k"),
        (["not", "an", "object"], "metadata"),
        ("text", "metadata"),
    ],
)
def test_bad_metadata_is_a_coded_400(alice, catalog, metadata, param):
    response = create(alice.client, requests=[record("r1")], metadata=metadata)
    error = assert_envelope(response, 400)
    assert error["param"] == param
    assert error["code"] in ("invalid_value", "invalid_type")


def test_metadata_at_the_limits_is_accepted(alice, catalog):
    metadata = {f"{i:02d}" + "k" * 62: "v" * 512 for i in range(16)}
    response = create(alice.client, requests=[record("r1")], metadata=metadata)
    assert response.status_code == 200 and response.json()["metadata"] == metadata


# --- the per-organization rate limit on batch creation ------------------------------


@pytest.fixture
def rate(settings):
    settings.OPENRELAY_BATCH_CREATE_RATE = "3/minute"


def test_batch_creation_is_rate_limited_per_organization(alice, bob, catalog, rate):
    for i in range(3):
        assert create(alice.client, requests=[record(f"r{i}")]).status_code == 200
    response = create(alice.client, requests=[record("r4")])
    error = assert_envelope(response, 429, "rate_limit_exceeded")
    assert error["type"] == "rate_limit_error"
    assert "3 per minute" in error["message"]
    retry_after = int(response["Retry-After"])
    assert 1 <= retry_after <= 60
    # Another organization has its own budget; reads are never throttled.
    assert create(bob.client, requests=[record("r1")]).status_code == 200
    assert alice.client.get("/v1/batches").status_code == 200


def test_every_key_of_an_organization_shares_the_budget(alice, catalog, rate):
    from rest_framework.test import APIClient

    _, second_key = ApiKey.issue(alice.org, name="second")
    second = APIClient()
    second.credentials(HTTP_AUTHORIZATION=f"Bearer {second_key}")
    for client in (alice.client, second, alice.client):
        assert create(client, requests=[record("r")]).status_code == 200
    assert_envelope(create(second, requests=[record("r")]), 429, "rate_limit_exceeded")


def test_refused_creates_count_too(alice, catalog, rate):
    # A flood of bad creates (each may scan a 200 MB file) is what the limit is for.
    for _ in range(3):
        assert create(alice.client, requests=[]).status_code == 400
    assert_envelope(create(alice.client, requests=[record("r")]), 429)


def test_the_openai_sdk_sees_a_rate_limit_error(alice, catalog, rate, live_server):
    import openai

    client = openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=alice.key, max_retries=0)
    file_id = client.files.create(file=("in.jsonl", jsonl(record("r1"))), purpose="batch").id
    for _ in range(3):
        client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.RateLimitError) as caught:
        client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    assert caught.value.code == "rate_limit_exceeded"
    assert caught.value.response.headers["retry-after"].isdigit()


def test_the_default_rate_is_2000_per_hour():
    from django.conf import settings

    assert parse_rate(settings.OPENRELAY_BATCH_CREATE_RATE) == (2000, 3600)


def test_a_broken_cache_lets_creates_through(alice, catalog, rate, monkeypatch):
    def down(*args, **kwargs):
        raise ConnectionError("redis is down")

    monkeypatch.setattr(caches["default"], "get", down)
    for i in range(5):
        assert create(alice.client, requests=[record(f"r{i}")]).status_code == 200


@pytest.mark.parametrize(
    "raw, parsed",
    [
        ("2000/hour", (2000, 3600)),
        ("5/s", (5, 1)),
        ("10/minute", (10, 60)),
        ("1/day", (1, 86400)),
        ("7/hours", (7, 3600)),
    ],
)
def test_rates_parse(raw, parsed):
    assert parse_rate(raw) == parsed


@pytest.mark.parametrize("raw", ["fast", "0/hour", "-1/hour", "10/fortnight", "10", "x/hour"])
def test_a_malformed_rate_stops_start_up(raw, monkeypatch):
    monkeypatch.setenv("OPENRELAY_BATCH_CREATE_RATE", raw)
    with pytest.raises(ImproperlyConfiguredEnv, match="OPENRELAY_BATCH_CREATE_RATE"):
        envrate("OPENRELAY_BATCH_CREATE_RATE", "2000/hour")


def test_throttle_keys_do_not_collide_across_recreated_organizations(db):
    # Primary keys are reused when a database is recreated; the cache may outlive it.
    from openrelay.api.throttles import BatchCreateThrottle

    class Request:
        def __init__(self, persona):
            self.user = type("User", (), {"organization": persona.org})()

    first = make_persona("first-org")
    key = BatchCreateThrottle().get_cache_key(Request(first), None)
    first.org.delete()
    second = make_persona("first-org")
    assert BatchCreateThrottle().get_cache_key(Request(second), None) != key
