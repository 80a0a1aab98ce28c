"""The simulated model server: answers, tool calls, fault directives, recording.

Plain pytest: nothing here touches Django or the database.
"""

import base64
import contextlib
import json
import math
import os
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from openrelay.lib import children
from openrelay.simulator.answers import arguments_from_schema, count_tokens
from openrelay.simulator.cli import add_arguments, config_from_options
from openrelay.simulator.config import SimulatorConfig
from openrelay.simulator.directives import parse_fault_directives
from openrelay.simulator.server import run_in_thread

REPO_ROOT = Path(__file__).resolve().parents[2]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        },
    },
}
CLOCK_TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}


@pytest.fixture(scope="module")
def sim():
    server = run_in_thread(SimulatorConfig()).start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def fresh_recordings(sim):
    sim.reset()


@pytest.fixture(scope="module")
def client(sim):
    with httpx.Client(base_url=sim.base_url, timeout=5) as http:
        yield http


def chat_body(content, **extra):
    return {"model": "sim-model", "messages": [{"role": "user", "content": content}], **extra}


def without_stamps(answer):
    return {k: v for k, v in answer.items() if k not in ("id", "created")}


def poll(condition, deadline_s=2.0):
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met before the deadline"
        time.sleep(0.005)


# ---------------------------------------------------------------- answers


def test_it_answers_chat_deterministically(client):
    first = client.post("/chat/completions", json=chat_body("What is the capital of France?"))
    second = client.post("/chat/completions", json=chat_body("What is the capital of France?"))
    assert first.status_code == 200
    answer = first.json()
    assert answer["id"].startswith("chatcmpl-") and answer["id"] != second.json()["id"]
    assert answer["object"] == "chat.completion"
    assert isinstance(answer["created"], int)
    assert answer["model"] == "sim-model"
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == "Simulated answer to: What is the capital of France?"
    assert without_stamps(answer) == without_stamps(second.json())


def test_it_reports_usage_by_the_documented_token_rule(client):
    question = "x" * 1000  # 250 tokens; half is 125, rounded down to 64 cached
    usage = client.post("/chat/completions", json=chat_body(question)).json()["usage"]
    assert usage["prompt_tokens"] == 250
    assert usage["prompt_tokens_details"]["cached_tokens"] == 64
    assert usage["completion_tokens_details"]["reasoning_tokens"] == 0
    answer_text = "Simulated answer to: " + "x" * 60
    assert usage["completion_tokens"] == math.ceil(len(answer_text) / 4)
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_it_reads_text_from_content_parts(client):
    body = chat_body([{"type": "text", "text": "abcd" * 10}, {"type": "image_url", "image_url": {"url": "x"}}])
    answer = client.post("/chat/completions", json=body).json()
    assert answer["usage"]["prompt_tokens"] == 10
    assert answer["choices"][0]["message"]["content"].endswith("abcd" * 10)


@pytest.mark.parametrize("cap_name", ["max_tokens", "max_completion_tokens"])
def test_it_caps_completion_tokens(client, cap_name):
    answer = client.post("/chat/completions", json=chat_body("Tell me a long story", **{cap_name: 3})).json()
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 3
    assert choice["message"]["content"] == "Simulated an"


def test_it_answers_n_choices(client):
    answer = client.post("/chat/completions", json=chat_body("hi", n=2)).json()
    assert [c["index"] for c in answer["choices"]] == [0, 1]


def test_it_answers_completions(client):
    response = client.post("/completions", json={"model": "sim-model", "prompt": ["Once upon", "a time"]})
    answer = response.json()
    assert answer["id"].startswith("cmpl-")
    assert answer["object"] == "text_completion"
    assert [c["text"] for c in answer["choices"]] == [
        "Simulated completion of: Once upon",
        "Simulated completion of: a time",
    ]
    assert answer["usage"]["prompt_tokens"] == 3 + 2
    again = client.post("/completions", json={"model": "sim-model", "prompt": ["Once upon", "a time"]}).json()
    assert without_stamps(again) == without_stamps(answer)


def test_it_answers_embeddings(client):
    answer = client.post("/embeddings", json={"model": "emb", "input": ["alpha", "beta"]}).json()
    assert answer["object"] == "list" and answer["model"] == "emb"
    first, second = (item["embedding"] for item in answer["data"])
    assert len(first) == 16
    assert math.isclose(sum(v * v for v in first), 1.0)
    assert first != second
    assert answer["usage"] == {"prompt_tokens": 2 + 1, "total_tokens": 3}  # ceil(5/4) + ceil(4/4)
    single = client.post("/embeddings", json={"model": "emb", "input": "alpha"}).json()
    assert single["data"][0]["embedding"] == first


def test_it_honours_embedding_dimensions_and_base64(client):
    wide = client.post("/embeddings", json={"model": "emb", "input": "alpha", "dimensions": 64}).json()
    vector = wide["data"][0]["embedding"]
    assert len(vector) == 64
    packed = client.post(
        "/embeddings", json={"model": "emb", "input": "alpha", "dimensions": 64, "encoding_format": "base64"}
    ).json()["data"][0]["embedding"]
    unpacked = struct.unpack("<64f", base64.b64decode(packed))
    assert all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-7) for a, b in zip(unpacked, vector))


def test_a_heavy_answer_is_built_apart_and_other_calls_are_answered_meanwhile(sim, client):
    """Issue 55, bench row 15: an embeddings answer of 2,048 x 3,072 was built on the server's loop,
    12-13 s on a loaded machine, and every other call waited for it (another organization's small
    calls took 34 s). Built in a child process, it holds no one; and it is the answer the loop builds."""
    inputs = [f"heavy {n}" for n in range(1_200)]  # 3.7 M numbers (HEAVY_NUMBERS: 1 M), ~75 MB of JSON
    heavy: dict = {}

    def ask_heavy():
        with httpx.Client(base_url=sim.base_url, timeout=120) as http:
            heavy["answer"] = http.post("/embeddings", json={"model": "emb", "input": inputs, "dimensions": 3072})
        heavy["done"] = time.monotonic()

    asker = threading.Thread(target=ask_heavy)
    asker.start()
    try:
        deadline = time.monotonic() + 30
        while sim.request_count < 1:
            assert time.monotonic() < deadline, "the heavy request never reached the server"
            time.sleep(0.01)
        sent = time.monotonic()
        chat = client.post(
            "/chat/completions",
            json={"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]},
            timeout=120,
        )
        answered = time.monotonic()
    finally:
        asker.join(120)
    assert chat.status_code == 200
    # Before: the chat waited the whole build of the heavy answer (seconds), answered just before it.
    assert answered - sent < 1.0, f"a small call waited {answered - sent:.2f} s behind a heavy answer"
    assert answered < heavy["done"]
    answer = heavy["answer"].json()
    assert len(answer["data"]) == 1_200
    assert answer["usage"]["prompt_tokens"] == sum(count_tokens(item) for item in inputs)
    small = client.post("/embeddings", json={"model": "emb", "input": inputs[-2:], "dimensions": 3072}).json()
    assert [item["embedding"] for item in answer["data"][-2:]] == [item["embedding"] for item in small["data"]]
    refused = client.post("/embeddings", json={"model": "emb", "input": [*inputs[:-1], ""], "dimensions": 3072})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "input"


def test_it_lists_models(client):
    models = client.get("/models").json()
    assert models["object"] == "list"
    assert {m["object"] for m in models["data"]} == {"model"}


def test_it_rejects_bad_bodies_with_the_openai_envelope(client):
    missing_model = client.post("/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert missing_model.status_code == 400
    assert missing_model.json()["error"]["param"] == "model"
    not_json = client.post("/chat/completions", content=b"{nope", headers={"content-type": "application/json"})
    assert not_json.status_code == 400
    assert set(not_json.json()["error"]) == {"message", "type", "param", "code"}
    assert client.post("/unknown").status_code == 404


# ---------------------------------------------------------------- tool calls


def run_tool_loop(client, content, tools, max_turns=10):
    """Play the executor: answer each tool call; return the turns seen."""
    messages = [{"role": "user", "content": content}]
    turns = []
    for _ in range(max_turns):
        answer = client.post("/chat/completions", json={"model": "m", "messages": messages, "tools": tools}).json()
        turns.append(answer["choices"][0])
        message = answer["choices"][0]["message"]
        if answer["choices"][0]["finish_reason"] != "tool_calls":
            break
        messages.append(message)
        for call in message["tool_calls"]:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"result of {call['id']}"})
    return turns


def test_it_calls_the_first_tool_then_answers_with_the_tool_result(client):
    turns = run_tool_loop(client, "Weather in Paris?", [WEATHER_TOOL, CLOCK_TOOL])
    assert [t["finish_reason"] for t in turns] == ["tool_calls", "stop"]
    call = turns[0]["message"]["tool_calls"][0]
    assert call["id"] == "call_0_0"
    assert call["type"] == "function"
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "sim", "days": 1}
    assert turns[0]["message"]["content"] is None
    assert turns[1]["message"]["content"] == "Final answer using: result of call_0_0"


def test_it_follows_the_tool_rounds_directive(client):
    turns = run_tool_loop(client, "Plan a trip [[tool_rounds:3]]", [WEATHER_TOOL])
    assert [t["finish_reason"] for t in turns] == ["tool_calls"] * 3 + ["stop"]
    assert [t["message"]["tool_calls"][0]["id"] for t in turns[:3]] == ["call_0_0", "call_1_0", "call_2_0"]
    endless = run_tool_loop(client, "Never stop [[tool_rounds:99]]", [WEATHER_TOOL], max_turns=6)
    assert {t["finish_reason"] for t in endless} == {"tool_calls"}


def test_it_makes_parallel_calls_cycling_over_the_tools(client):
    turns = run_tool_loop(client, "Both please [[tool_calls:3]]", [WEATHER_TOOL, CLOCK_TOOL])
    calls = turns[0]["message"]["tool_calls"]
    assert [c["id"] for c in calls] == ["call_0_0", "call_0_1", "call_0_2"]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time", "get_weather"]
    assert turns[1]["message"]["content"] == "Final answer using: result of call_0_2"


def test_it_uses_literal_tool_arguments(client):
    content = 'Go [[tool_args:{"city": "Oslo", "nested": [[1, 2]]}]] now'
    turns = run_tool_loop(client, content, [WEATHER_TOOL])
    arguments = turns[0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(arguments) == {"city": "Oslo", "nested": [[1, 2]]}


def test_it_builds_arguments_from_the_schema():
    properties = {
        "s": {"type": "string"},
        "i": {"type": "integer"},
        "f": {"type": "number"},
        "b": {"type": "boolean"},
        "o": {"type": "object"},
        "maybe": {"type": ["string", "null"]},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    }
    assert arguments_from_schema({"properties": properties}) == {
        "s": "sim",
        "i": 1,
        "f": 1.5,
        "b": True,
        "o": None,
        "maybe": "sim",
        "unit": "celsius",
    }


def test_it_honours_tool_choice(client):
    forced = {"type": "function", "function": {"name": "get_time"}}
    body = chat_body("hi", tools=[WEATHER_TOOL, CLOCK_TOOL], tool_choice=forced)
    choice = client.post("/chat/completions", json=body).json()["choices"][0]
    assert choice["message"]["tool_calls"][0]["function"]["name"] == "get_time"
    body = chat_body("hi", tools=[WEATHER_TOOL], tool_choice="none")
    assert client.post("/chat/completions", json=body).json()["choices"][0]["finish_reason"] == "stop"


# ---------------------------------------------------------------- fault directives


@pytest.mark.parametrize("status", [400, 500, 503])
def test_it_answers_a_status_directive_with_the_error_envelope(client, status):
    response = client.post("/chat/completions", json=chat_body(f"fail please [[status:{status}]]"))
    assert response.status_code == status
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_it_sends_retry_after_with_429(client):
    response = client.post("/chat/completions", json=chat_body("slow down [[status:429]]"))
    assert response.status_code == 429
    assert response.headers["retry-after"] == "1"
    assert response.json()["error"]["code"] == "rate_limit_exceeded"
    with run_in_thread(SimulatorConfig(retry_after_s=0.25)) as fast:
        response = httpx.post(fast.base_url + "/chat/completions", json=chat_body("[[status:429]]"))
    assert response.headers["retry-after"] == "0.25"
    assert response.headers["retry-after-ms"] == "250"


def test_it_fails_a_body_k_times_then_answers(client):
    body = chat_body("flaky [[status:503x2]]")
    statuses = [client.post("/chat/completions", json=body).status_code for _ in range(4)]
    assert statuses == [503, 503, 200, 200]
    other_body = chat_body("another flaky [[status:503x2]]")
    assert client.post("/chat/completions", json=other_body).status_code == 503


def test_it_forgets_the_per_body_counts_on_reset(sim, client):
    body = chat_body("flaky [[status:503x1]]")
    assert client.post("/chat/completions", json=body).status_code == 503
    sim.reset()
    assert client.post("/chat/completions", json=body).status_code == 503


def test_it_reads_directives_from_tool_messages(client):
    messages = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_0_0", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "call_0_0", "content": "[[status:500]]"},
    ]
    assert client.post("/chat/completions", json={"model": "m", "messages": messages}).status_code == 500


def test_it_drops_the_connection(client):
    with pytest.raises(httpx.TransportError):
        client.post("/chat/completions", json=chat_body("[[drop]]"))


def test_it_drops_once_then_answers(client):
    body = chat_body("[[dropx1]]")
    with pytest.raises(httpx.TransportError):
        client.post("/chat/completions", json=body)
    assert client.post("/chat/completions", json=body).status_code == 200


def test_it_hangs_until_the_client_gives_up(client):
    with pytest.raises(httpx.ReadTimeout):
        client.post("/chat/completions", json=chat_body("[[hang]]"), timeout=0.2)


def test_it_waits_for_the_latency_directive(client):
    started = time.perf_counter()
    response = client.post("/chat/completions", json=chat_body("[[latency:150]] hi"))
    assert response.status_code == 200
    assert time.perf_counter() - started >= 0.15
    assert response.json()["choices"][0]["message"]["content"] == "Simulated answer to: hi"


def test_it_applies_directives_to_completions_and_embeddings(client):
    assert client.post("/completions", json={"model": "m", "prompt": "[[status:502]]"}).status_code == 502
    assert client.post("/embeddings", json={"model": "m", "input": ["ok", "[[status:429]]"]}).status_code == 429


def test_parse_fault_directives_keeps_the_first_of_each_kind():
    found = parse_fault_directives("[[status:503x2]] [[status:500]] [[latency:20]] [[dropx3]]")
    assert (found.status, found.status_times, found.latency_ms) == (503, 2, 20.0)
    assert (found.drop, found.drop_times, found.hang) == (True, 3, False)


# ---------------------------------------------------------------- server-wide knobs


def statuses_for(sim, bodies):
    with httpx.Client(base_url=sim.base_url, timeout=5) as http:
        return {b["messages"][0]["content"]: http.post("/chat/completions", json=b).status_code for b in bodies}


def test_it_draws_server_wide_errors_reproducibly_from_the_seed():
    bodies = [chat_body(f"question {i}") for i in range(80)]
    config = {"error_rates": {503: 0.2, 429: 0.1}, "seed": 7}
    with run_in_thread(SimulatorConfig(**config)) as first:
        first_run = statuses_for(first, bodies)
    # Another server, requests in another order: the same fate per body.
    with run_in_thread(SimulatorConfig(**config)) as second:
        second_run = statuses_for(second, list(reversed(bodies)))
    with run_in_thread(SimulatorConfig(**{**config, "seed": 8})) as reseeded:
        reseeded_run = statuses_for(reseeded, bodies)
    assert first_run == second_run
    assert first_run != reseeded_run
    counts = list(first_run.values())
    assert set(counts) == {200, 429, 503}
    assert 40 <= counts.count(200) <= 70


def test_it_drops_and_hangs_at_the_configured_rates():
    with run_in_thread(SimulatorConfig(drop_rate=1.0)) as dropping:
        with pytest.raises(httpx.TransportError):
            httpx.post(dropping.base_url + "/chat/completions", json=chat_body("hi"))
    with run_in_thread(SimulatorConfig(hang_rate=1.0)) as hanging:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(hanging.base_url + "/chat/completions", json=chat_body("hi"), timeout=0.2)


def test_it_adds_the_server_wide_latency():
    with run_in_thread(SimulatorConfig(latency_ms=100)) as slow:
        started = time.perf_counter()
        assert httpx.post(slow.base_url + "/chat/completions", json=chat_body("hi")).status_code == 200
        assert time.perf_counter() - started >= 0.1


def test_it_simulates_a_dead_deployment():
    with run_in_thread(SimulatorConfig(fail_all_status=503)) as dead:
        assert httpx.post(dead.base_url + "/chat/completions", json=chat_body("hi")).status_code == 503
        assert httpx.get(dead.base_url + "/models").status_code == 503
        assert dead.request_count == 1
    with run_in_thread(SimulatorConfig(drop_all=True)) as unreachable:
        with pytest.raises(httpx.TransportError):
            httpx.post(unreachable.base_url + "/embeddings", json={"model": "m", "input": "x"})


def test_it_stops_promptly_while_a_request_hangs():
    hung = run_in_thread(SimulatorConfig()).start()
    outcome = []

    def wait_forever():
        try:
            httpx.post(hung.base_url + "/chat/completions", json=chat_body("[[hang]]"), timeout=5)
        except httpx.HTTPError as exc:
            outcome.append(exc)

    caller = threading.Thread(target=wait_forever)
    caller.start()
    poll(lambda: hung.request_count == 1)
    started = time.perf_counter()
    hung.stop()
    caller.join(timeout=2)
    assert time.perf_counter() - started < 1
    assert not caller.is_alive() and isinstance(outcome[0], httpx.TransportError)
    assert not [t for t in threading.enumerate() if t.name == f"simulator:{hung.port}"]


# ---------------------------------------------------------------- recording


def test_it_records_requests_without_secrets(sim, client):
    client.post("/chat/completions", json=chat_body("first"), headers={"Authorization": "Bearer sk-secret"})
    client.post("/embeddings", json={"model": "emb", "input": "second"}, headers={"X-Trace": "t1"})
    recorded = sim.requests()
    assert [r["path"] for r in recorded] == ["/v1/chat/completions", "/v1/embeddings"]
    assert recorded[0]["body"] == chat_body("first")
    assert "authorization" not in recorded[0]["headers"]
    assert recorded[1]["headers"]["x-trace"] == "t1"
    assert client.get(sim.url + "/_sim/requests").json() == recorded
    assert sim.bodies("/v1/embeddings") == [{"model": "emb", "input": "second"}]


def test_it_records_failed_attempts_too(sim, client):
    client.post("/chat/completions", json=chat_body("[[status:503]]"))
    assert len(sim.requests()) == 1


def test_it_resets_over_http(sim, client):
    client.post("/chat/completions", json=chat_body("hi"))
    assert client.post(sim.url + "/_sim/reset").status_code == 200
    assert sim.requests() == [] and sim.request_count == 0


def test_it_counts_calls_by_client_address_and_the_most_in_flight_at_once(sim, client):
    def hung(tag):
        with contextlib.suppress(httpx.TimeoutException):
            httpx.post(sim.base_url + "/chat/completions", json=chat_body(f"{tag} [[latency:400]]"), timeout=5)

    threads = [threading.Thread(target=hung, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    poll(lambda: client.get(sim.url + "/_sim/calls").json()["in_flight"] == 3)
    assert client.get(sim.url + "/_sim/calls").json()["in_flight_by_peer"] == {"127.0.0.1": 3}
    for thread in threads:
        thread.join()
    calls = client.get(sim.url + "/_sim/calls").json()
    assert calls == {
        "total": 3,
        "by_peer": {"127.0.0.1": 3},
        "in_flight": 0,
        "in_flight_by_peer": {},
        "max_in_flight": 3,
    }
    client.post(sim.url + "/_sim/reset")
    assert client.get(sim.url + "/_sim/calls").json() == {
        "total": 0,
        "by_peer": {},
        "in_flight": 0,
        "in_flight_by_peer": {},
        "max_in_flight": 0,
    }


def test_it_keeps_only_the_last_recordings_or_none():
    with run_in_thread(SimulatorConfig(record_limit=3)) as bounded:
        for i in range(5):
            httpx.post(bounded.base_url + "/chat/completions", json=chat_body(f"q{i}"))
        assert [b["messages"][0]["content"] for b in bounded.bodies()] == ["q2", "q3", "q4"]
    with run_in_thread(SimulatorConfig(record=False)) as silent:
        httpx.post(silent.base_url + "/chat/completions", json=chat_body("q"))
        assert silent.requests() == [] and silent.request_count == 1


# ---------------------------------------------------------------- command line


def test_it_builds_the_config_from_command_line_flags():
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    flags = "--latency-ms 5 --error-rate 503=0.1 --error-rate 429=0.05,500=0.01 --drop-rate 0.02 "
    flags += "--retry-after 2 --seed 3 --fail-all-status 502 --no-record"
    config = config_from_options(vars(parser.parse_args(flags.split())))
    assert config.error_rates == {503: 0.1, 429: 0.05, 500: 0.01}
    assert (config.latency_ms, config.drop_rate, config.retry_after_s, config.seed) == (5, 0.02, 2, 3)
    assert config.fail_all_status == 502 and config.record is False


def test_it_runs_standalone_as_a_module():
    process = children.popen(
        [sys.executable, "-m", "openrelay.simulator", "--port", "0"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    try:
        line = process.stdout.readline()
        assert line.startswith("Simulated model server on http://127.0.0.1:")
        base_url = line.split()[-1]
        assert httpx.post(base_url + "/chat/completions", json=chat_body("hi")).status_code == 200
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=5) == 0
        process.stdout.close()
