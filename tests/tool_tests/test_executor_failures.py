"""Every way the http executor can fail ends the record with tool_execution_failed.

The executor URL carries a token in its query and the config an
authorization value: neither may appear in the stored outcome.
"""

import orjson
import pytest

from batches.engine.calls.caller import Usage
from batches.engine.tools.base import ToolExecutionFailed
from batches.engine.tools.http_executor import parse_results
from tests.fixtures.tool_executor import missing_result, raw, redirect, shaped, sleep, status, streamed
from tests.tool_tests.conftest import CHAT, SIM_MODEL

SECRET = "Bearer tool-secret-123"
QUERY_SECRET = "query-secret-456"
WEATHER_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}


def tool_body(url, text="Weather? [[tool_calls:2]]", **config):
    return {
        "model": SIM_MODEL,
        "messages": [{"role": "user", "content": text}],
        "tools": [WEATHER_TOOL],
        "openrelay": {"tool_config": {"url": url, "authorization": SECRET, **config}},
    }


def secret_url(executor):
    return f"{executor.url}?token={QUERY_SECRET}"


def assert_failed(outcome, message):
    assert not outcome.succeeded
    assert outcome.error_code == "tool_execution_failed"
    assert message in outcome.error_message, outcome.error_message
    assert outcome.usage == Usage()
    assert outcome.body is None and outcome.status_code is None
    stored = orjson.dumps(vars(outcome), default=str).decode()
    assert "tool-secret" not in stored and QUERY_SECRET not in stored and "/tools" not in stored


FAILURES = {
    "status 500": (status(500), "non-2xx status 500"),
    "status 404": (status(404), "non-2xx status 404"),
    "redirect": (redirect("http://169.254.169.254/latest/meta-data"), "non-2xx status 302. Redirects are not followed"),
    "malformed JSON": (raw(b'{"results": [oops'), "malformed JSON"),
    "not an object": (raw(b'["call_0_0"]'), 'expected an object with a "results" list'),
    "results not a list": (
        shaped(lambda p: {"results": {"call_0_0": "x"}}),
        'expected an object with a "results" list',
    ),
    "result not an object": (shaped(lambda p: {"results": ["x"]}), "result 0 is not an object"),
    "id not a string": (
        shaped(lambda p: {"results": [{"tool_call_id": 7, "content": "x"}]}),
        'no string "tool_call_id"',
    ),
    "no content": (
        shaped(lambda p: {"results": [{"tool_call_id": c["id"]} for c in p["tool_calls"]]}),
        'result 0 has no "content"',
    ),
    "unknown id": (
        shaped(lambda p: {"results": [{"tool_call_id": "call_9_9", "content": "x"}]}),
        "unknown tool_call_id 'call_9_9'",
    ),
    "duplicate id": (
        shaped(lambda p: {"results": [{"tool_call_id": "call_0_0", "content": "x"}] * 2}),
        "more than one result for tool_call_id 'call_0_0'",
    ),
    "missing result": (missing_result(), "missing result for tool_call_id 'call_0_1'"),
    "over the size cap": (raw(b" " * (11 * 1024 * 1024)), "over the size cap (10485760 bytes)"),
    "over the size cap, chunked": (streamed(11 * 1024 * 1024), "over the size cap (10485760 bytes)"),
}


@pytest.mark.parametrize("answer, message", FAILURES.values(), ids=FAILURES.keys())
def test_it_fails_the_record(sim, executor, run_record, answer, message):
    executor.answer(answer)
    outcome = run_record(tool_body(secret_url(executor))).outcome

    assert_failed(outcome, message)
    assert len(executor.received) == 1
    assert len(sim.bodies(CHAT)) == 1  # no turn after the failure


def test_it_fails_on_timeout(sim, executor, run_record):
    executor.answer(sleep(5))
    outcome = run_record(tool_body(secret_url(executor), timeout_ms=200)).outcome

    assert_failed(outcome, "timed out: no answer within 0.2s")


def test_it_refuses_a_private_url_unless_allowed(sim, executor, run_record):
    outcome = run_record(tool_body(secret_url(executor)), allow_private=False).outcome

    assert_failed(
        outcome, f"The tool executor URL is blocked: http://127.0.0.1:{executor.port}: the host is not allowed"
    )
    assert executor.received == []


def test_it_fails_when_the_executor_is_unreachable(sim, executor, run_record):
    # Port 9 (discard) on loopback: nothing listens there.
    outcome = run_record(tool_body(f"http://127.0.0.1:9/tools?token={QUERY_SECRET}")).outcome

    assert_failed(outcome, "The tool executor could not be called: http://127.0.0.1:9: could not connect")


def test_it_fails_on_an_authorization_value_that_cannot_be_a_header(sim, executor, run_record):
    body = tool_body(secret_url(executor))
    body["openrelay"]["tool_config"]["authorization"] = "Bearer tool-secret\r\nX-Injected: 1"
    outcome = run_record(body).outcome

    assert_failed(outcome, "request header 'Authorization' is not valid")
    assert executor.received == []


def test_it_uses_the_settings_switch_for_private_urls(sim, executor, run_record, settings):
    # The worker builds OutboundClient() without arguments: the setting decides.
    settings.OPENRELAY_ALLOW_PRIVATE_URLS = False
    outcome = run_record(tool_body(secret_url(executor)), allow_private=None).outcome
    assert_failed(outcome, "not allowed (a private, loopback")

    settings.OPENRELAY_ALLOW_PRIVATE_URLS = True
    assert run_record(tool_body(secret_url(executor)), allow_private=None).outcome.succeeded


def test_parse_results_delivers_strings_as_is_and_other_values_as_json():
    results = parse_results(
        {
            "results": [
                {"tool_call_id": "b", "content": None},
                {"tool_call_id": "a", "content": "plain text"},
                {"tool_call_id": "c", "content": [1, 2.5, True], "extra": "ignored"},
            ],
            "extra": 1,
        },
        ["a", "b", "c"],
    )

    assert [(r.tool_call_id, r.content) for r in results] == [("a", "plain text"), ("b", "null"), ("c", "[1,2.5,true]")]


def test_parse_results_shortens_long_ids_in_messages():
    with pytest.raises(ToolExecutionFailed) as caught:
        parse_results({"results": []}, ["x" * 500])

    assert "x" * 100 + "..." in str(caught.value)
    assert "x" * 101 not in str(caught.value)
