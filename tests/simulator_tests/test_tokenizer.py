"""The simulator's tokenizer routes: vLLM's /tokenize and llama.cpp's input_tokens, on request only."""

import httpx
import pytest

from openrelay.simulator.config import SimulatorConfig
from openrelay.simulator.server import run_in_thread

CHAT = {
    "model": "m",
    "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there!"}],
}


def prompt_tokens(server):
    return httpx.post(f"{server.base_url}/chat/completions", json=CHAT).json()["usage"]["prompt_tokens"]


def test_vllm_style_counts_messages_and_prompts_as_the_call_reports():
    with run_in_thread(SimulatorConfig(tokenizer="vllm")) as server:
        counted = httpx.post(f"{server.url}/tokenize", json=CHAT).json()
        assert counted["count"] == prompt_tokens(server) == len(counted["tokens"])
        assert httpx.post(f"{server.url}/tokenize", json={"prompt": "x" * 40}).json()["count"] == 10
        assert httpx.post(f"{server.url}/tokenize", json={}).status_code == 400
        assert server.requests("/tokenize")[0]["body"] == CHAT
        assert httpx.post(f"{server.base_url}/chat/completions/input_tokens", json=CHAT).status_code == 404


def test_llamacpp_style_counts_a_chat_request_and_its_tokenize_counts_raw_text():
    with run_in_thread(SimulatorConfig(tokenizer="llamacpp")) as server:
        counted = httpx.post(f"{server.base_url}/chat/completions/input_tokens", json=CHAT).json()
        assert counted == {"input_tokens": prompt_tokens(server)}
        raw = httpx.post(f"{server.url}/tokenize", json={"content": "x" * 40}).json()
        assert raw == {"tokens": list(range(10))}  # no count, no template
        assert httpx.post(f"{server.url}/tokenize", json=CHAT).json() == {"tokens": []}


def test_no_tokenizer_by_default_and_a_bad_style_is_refused():
    with run_in_thread(SimulatorConfig()) as server:
        assert httpx.post(f"{server.url}/tokenize", json=CHAT).status_code == 404
    with pytest.raises(ValueError, match="tokenizer"):
        SimulatorConfig(tokenizer="sglang")


def test_a_failing_server_fails_its_tokenizer_too():
    with run_in_thread(SimulatorConfig(tokenizer="vllm", fail_all_status=503)) as server:
        assert httpx.post(f"{server.url}/tokenize", json=CHAT).status_code == 503
