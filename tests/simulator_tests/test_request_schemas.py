"""The simulator refuses what a real server refuses (issue 50): a body its endpoint's published request type
does not take is a 400 in the endpoint's envelope, naming the param, and is never answered as a success."""

import httpx
import pytest

USER = [{"role": "user", "content": "hi"}]

REFUSED = [
    (
        "chat/completions",
        {"messages": USER, "response_format": {"format": {"type": "json_schema"}}},
        "response_format.type",
    ),
    ("chat/completions", {"messages": USER, "response_format": {"type": "banana"}}, "response_format.type"),
    ("chat/completions", {"messages": USER, "temperature": "hot"}, "temperature"),
    ("chat/completions", {"messages": USER, "n": "two"}, "n"),
    ("chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
    ("completions", {"prompt": "hi", "n": "two"}, "n"),
    ("embeddings", {"input": "hi", "encoding_format": "hex"}, "encoding_format"),
    ("moderations", {"input": [{"type": "banana"}]}, "input.0"),
    ("responses", {"input": "hi", "text": {"format": {"type": "banana"}}}, "text.format.type"),
]


@pytest.mark.parametrize(("path", "body", "param"), REFUSED)
def test_a_body_a_server_refuses_is_a_400_in_openais_envelope(sim, path, body, param):
    answer = httpx.post(f"{sim.base_url}/{path}", json={"model": "m", **body})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    assert f"'{param}'" in error["message"]


def test_messages_refuses_in_anthropics_envelope(sim):
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "wizard", "content": "x"}]}
    answer = httpx.post(f"{sim.base_url}/messages", json=body)
    assert answer.status_code == 400
    assert answer.json()["type"] == "error"
    assert answer.json()["error"]["type"] == "invalid_request_error"
    assert "'messages.0.role'" in answer.json()["error"]["message"]


def test_fields_the_schema_does_not_name_pass(sim):
    body = {"model": "m", "messages": USER, "top_k": 20, "chat_template_kwargs": {"enable_thinking": False}}
    answer = httpx.post(f"{sim.base_url}/chat/completions", json=body)
    assert answer.status_code == 200, answer.text
