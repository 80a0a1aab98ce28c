"""Hypothesis-generated input through the real routes: zero 5xx, every rejection coded.

JSONL lines of every shape (valid JSON of random shapes, random bytes, deep
nesting, huge numbers, odd unicode, near-valid records) go through upload +
create; random parameters go to create, list, retrieve, cancel and every
Files route. Whatever comes back is either a success or an error in the
envelope with a code; for a created batch every non-blank line is either a
record or a coded rejection naming its line.
"""

import os
import string
import time
from urllib.parse import quote

import orjson
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from batches.validation import schema_cost
from batches.validation.contracts import MAX_SCHEMA_DEPTH, MAX_SCHEMA_NODES
from tests.contract_tests import hostile
from tests.helpers import CHAT
from tests.reliability_tests.conftest import assert_envelope, record, upload

# Derandomized for CI (the same examples every run); OPENRELAY_FUZZ_EXAMPLES=2000 with
# OPENRELAY_FUZZ_RANDOM=1 digs deeper locally.
FUZZ = settings(
    max_examples=int(os.environ.get("OPENRELAY_FUZZ_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=not os.environ.get("OPENRELAY_FUZZ_RANDOM"),
)

# --- JSON values and lines ------------------------------------------------------------------

ODD_TEXT = st.text(
    alphabet=st.one_of(
        st.characters(codec="utf-8"),  # every valid scalar value: RTL marks, combining, astral, controls
        st.sampled_from(["\x00", "\u2028", "\u2029", "\ufeff", "\U0001f600", "\u202e", "\\", '"', "\n"]),
    ),
    max_size=40,
)
HUGE_NUMBERS = st.one_of(
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=False, allow_infinity=False),
)
SCALARS = st.one_of(st.none(), st.booleans(), HUGE_NUMBERS, ODD_TEXT)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(ODD_TEXT, children, max_size=4)),
    max_leaves=20,
)


def _dumps(value):
    # The stdlib writes integers of any size (orjson refuses past 64 bits), as a client might.
    import json

    return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")


KNOWN_KEYS = ["custom_id", "method", "url", "body"]
BODY_KEYS = ["model", "messages", "stream", "openrelay", "tools", "max_tokens", "tool_config"]


@st.composite
def near_records(draw):
    """Records with one or two fields bent: the shapes that reach the per-record checks."""
    line = record(draw(st.one_of(st.text(max_size=8), st.just("dup"))), draw(ODD_TEXT))
    for _ in range(draw(st.integers(0, 2))):
        where = draw(st.sampled_from(["top", "body", "openrelay"]))
        value = draw(JSON_VALUES)
        if where == "top":
            line[draw(st.sampled_from(KNOWN_KEYS + ["extra"]))] = value
        elif where == "body" and isinstance(line.get("body"), dict):
            line["body"][draw(st.sampled_from(BODY_KEYS))] = value
        elif isinstance(line.get("body"), dict):
            kind = draw(st.sampled_from(["tool_config", "workflow", "other"]))
            line["body"]["openrelay"] = {
                kind: value
                if kind == "other"
                else draw(
                    st.dictionaries(
                        st.sampled_from(
                            [
                                "url",
                                "authorization",
                                "type",
                                "max_rounds",
                                "timeout_ms",
                                "max_steps",
                                "context",
                                "bogus",
                            ]
                        ),
                        JSON_VALUES,
                        max_size=4,
                    )
                )
            }
    return _dumps(line)


def _deep(depth, open_, close):
    return open_ * depth + b"0" + close * depth


LINES = st.one_of(
    near_records(),
    JSON_VALUES.map(_dumps),
    st.binary(max_size=60).filter(lambda b: b"\n" not in b),
    st.integers(1, 3000).map(lambda d: _deep(d, b"[", b"]")),
    st.integers(1, 3000).map(lambda d: b'{"custom_id":"d","body":' + _deep(d, b'{"a":', b"}") + b"}"),
    st.sampled_from(
        [
            b"{",
            b"}",
            b"[1,]",
            b'{"a":1}{"b":2}',
            b"1e999",
            b"-0",
            b"NaN",
            b'"\\ud800"',
            b"\xed\xa0\x80",
            b"\xef\xbb\xbf{}",
            b"\t",
            b"   ",
            b"\r",
            b"18446744073709551616",
        ]
    ),
)


@pytest.mark.django_db
@FUZZ
@given(lines=st.lists(LINES, min_size=1, max_size=8))
def test_random_jsonl_lines_through_upload_and_create(alice, catalog, lines):
    content = b"\n".join([orjson.dumps(record("first"))] + lines) + b"\n"
    uploaded = upload(alice.client, content)
    if uploaded.status_code != 200:
        assert_envelope(uploaded, 400)  # e.g. not UTF-8: refused whole at upload
        return
    response = alice.client.post(
        "/v1/batches",
        {"input_file_id": uploaded.json()["id"], "endpoint": CHAT, "completion_window": "24h"},
        format="json",
    )
    if response.status_code != 200:
        assert_envelope(response, 400)
        return
    batch = response.json()
    rejected = (batch["errors"] or {}).get("data", [])
    for error in rejected:
        assert isinstance(error["code"], str) and error["code"] and isinstance(error["line"], int), error
    records = [n for n, line in enumerate(content.split(b"\n")[:-1], start=1) if line.strip(b" \t\r\n")]
    # Every non-blank line is exactly one of: a record, or a rejection naming its line.
    assert batch["request_counts"]["total"] + len(rejected) == len(records)
    assert len({e["line"] for e in rejected}) == len(rejected)
    assert {e["line"] for e in rejected} <= set(records)


@pytest.mark.django_db
@FUZZ
@given(requests=st.lists(st.one_of(JSON_VALUES, near_records().map(orjson.loads)), min_size=0, max_size=5))
def test_random_inline_requests(alice, catalog, requests):
    response = alice.client.post(
        "/v1/batches",
        _dumps({"endpoint": CHAT, "completion_window": "24h", "requests": requests}),
        content_type="application/json",
    )
    if response.status_code != 200:
        assert_envelope(response, 400)
        return
    batch = response.json()
    rejected = (batch["errors"] or {}).get("data", [])
    assert batch["request_counts"]["total"] + len(rejected) == len(requests)


# --- API parameters -------------------------------------------------------------------------

CREATE_KEYS = [
    "input_file_id",
    "requests",
    "endpoint",
    "completion_window",
    "metadata",
    "output_expires_after",
    "priority",
    "model",
    "",
]
PLAUSIBLE = {
    "endpoint": st.sampled_from([CHAT, "/v1/completions", "/v1/embeddings", "/v1/responses", ""]),
    "completion_window": st.sampled_from(["24h", "1h", "", "24H"]),
    "priority": st.sampled_from(["standard", "expedited", "urgent"]),
    "output_expires_after": st.fixed_dictionaries(
        {}, optional={"anchor": st.sampled_from(["created_at", "now"]), "seconds": HUGE_NUMBERS}
    ),
    "metadata": st.dictionaries(st.text(max_size=70), st.one_of(st.text(max_size=600), JSON_VALUES), max_size=18),
    "requests": st.lists(near_records().map(orjson.loads), max_size=3),
    "input_file_id": st.one_of(ODD_TEXT, st.just("file-doesnotexist")),
}


@st.composite
def create_bodies(draw):
    body = {}
    for key in draw(st.lists(st.sampled_from(CREATE_KEYS), unique=True, max_size=6)):
        strategy = PLAUSIBLE.get(key)
        body[key] = draw(st.one_of(strategy, JSON_VALUES) if strategy is not None else JSON_VALUES)
    return body


@pytest.mark.django_db
@FUZZ
@given(body=st.one_of(create_bodies(), JSON_VALUES))
def test_random_create_parameters(alice, catalog, body):
    response = alice.client.post("/v1/batches", _dumps(body), content_type="application/json")
    if response.status_code != 200:
        assert_envelope(response)


@pytest.mark.django_db
@FUZZ
@given(
    raw=st.binary(max_size=200),
    content_type=st.sampled_from(
        ["application/json", "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", ""]
    ),
)
def test_random_create_bodies_and_content_types(alice, catalog, raw, content_type):
    response = alice.client.generic("POST", "/v1/batches", raw, content_type=content_type)
    if response.status_code != 200:
        assert_envelope(response)


IDS = st.one_of(
    ODD_TEXT.filter(lambda s: s not in ("", ".", "..")),
    st.text(alphabet=string.printable, min_size=1, max_size=30),
    st.sampled_from(["batch_" + "0" * 32, "file-" + "a" * 22, "%00", "\x00", "a" * 5000, "null", "-1"]),
)
QUERY = st.dictionaries(
    st.sampled_from(["limit", "after", "order", "purpose", "x"]),
    st.one_of(ODD_TEXT, st.integers(-(10**20), 10**20).map(str)),
    max_size=4,
)


def _path(template, value):
    return template.format(quote(value, safe=""))


@pytest.mark.django_db
@FUZZ
@given(batch_id=IDS, query=QUERY, route=st.sampled_from(["list", "get", "cancel"]))
def test_random_batch_route_parameters(alice, catalog, batch_id, query, route):
    if route == "list":
        response = alice.client.get("/v1/batches", query)
    elif route == "get":
        response = alice.client.get(_path("/v1/batches/{}", batch_id), query)
    else:
        response = alice.client.post(_path("/v1/batches/{}/cancel", batch_id), query)
    if response.status_code != 200:
        assert_envelope(response)


@pytest.mark.django_db
@FUZZ
@given(file_id=IDS, query=QUERY, route=st.sampled_from(["list", "get", "delete", "content"]))
def test_random_file_route_parameters(alice, catalog, file_id, query, route):
    path = {"list": "/v1/files", "get": "/v1/files/{}", "delete": "/v1/files/{}", "content": "/v1/files/{}/content"}
    url = _path(path[route], file_id)
    response = alice.client.delete(url) if route == "delete" else alice.client.get(url, query)
    if response.status_code != 200:
        assert_envelope(response)


@pytest.mark.django_db
@FUZZ
@given(
    fields=st.dictionaries(
        st.sampled_from(["purpose", "expires_after[anchor]", "expires_after[seconds]", "file", "other"]),
        st.one_of(ODD_TEXT.map(lambda s: s.replace("\x00", "")), st.integers(-(10**20), 10**20).map(str)),
        max_size=4,
    ),
    content=st.one_of(st.binary(max_size=100), LINES),
    filename=st.one_of(st.just("in.jsonl"), ODD_TEXT),
)
def test_random_upload_fields(alice, fields, content, filename):
    from django.core.exceptions import SuspiciousFileOperation
    from django.core.files.uploadedfile import SimpleUploadedFile

    data = dict(fields)
    if "file" in data:
        try:
            data["file"] = SimpleUploadedFile(filename, content, content_type="application/jsonl")
        except SuspiciousFileOperation:  # the test client refuses to send such a name
            assume(False)
    response = alice.client.post("/v1/files", data, format="multipart")
    if response.status_code != 200:
        assert_envelope(response)


# --- hostile output-contract schemas (issue 56) ----------------------------------------------


def _schema_chain(levels, combinator):
    return hostile.items_chain(levels) if combinator == "items" else hostile.chain(levels, combinator)


HOSTILE_SCHEMAS = st.one_of(
    st.builds(_schema_chain, st.integers(1, 40), st.sampled_from(["anyOf", "allOf", "oneOf", "items"])),
    st.sampled_from(hostile.REFUSED),
    st.sampled_from(hostile.ACCEPTED),
)


@pytest.mark.django_db
@FUZZ
@given(schema=HOSTILE_SCHEMAS, where=st.sampled_from(["record", "response_format"]))
def test_hostile_contract_schemas_are_refused_at_create_or_accepted_quickly(alice, catalog, schema, where):
    if where == "record":
        line = record("c", openrelay={"output_contract": {"schema": schema}})
    else:
        line = record("c", response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    started = time.monotonic()
    uploaded = upload(alice.client, orjson.dumps(line) + b"\n")
    response = alice.client.post(
        "/v1/batches",
        {"input_file_id": uploaded.json()["id"], "endpoint": CHAT, "completion_window": "24h"},
        format="json",
    )
    assert time.monotonic() - started < 5
    assert response.status_code == 200, response.content[:500]
    try:
        schema_cost.cost(schema, MAX_SCHEMA_NODES, MAX_SCHEMA_DEPTH)
        refused = False
    except schema_cost.TooCostly:
        refused = True
    errors = (response.json()["errors"] or {}).get("data", [])
    assert bool(errors) == refused, errors
    for error in errors:
        assert error["code"] == "invalid_output_contract" and error["line"] == 1 and error["param"], error
