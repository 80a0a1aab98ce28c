"""Fixtures for the quote tests: stored files in tmp_path, simulators with and without a tokenizer;
the request lines and the estimate call the API tests share."""

import pytest

from openrelay.simulator.config import SimulatorConfig
from openrelay.simulator.server import run_in_thread
from tests.helpers import CHAT, MODEL, chat


@pytest.fixture(autouse=True)
def _storage(tmp_storage):
    """Every quote test keeps its stored files in tmp_path."""


@pytest.fixture
def vllm_sim():
    with run_in_thread(SimulatorConfig(tokenizer="vllm")) as server:
        yield server


@pytest.fixture
def llamacpp_sim():
    with run_in_thread(SimulatorConfig(tokenizer="llamacpp")) as server:
        yield server


def line(i, content=None, model=MODEL, **body):
    return {
        "custom_id": f"req-{i}",
        "method": "POST",
        "url": CHAT,
        "body": {**chat(content or f"question {i}", **body), "model": model},
    }


def quote(persona, **params):
    body = {"endpoint": CHAT, "completion_window": "24h", **params}
    return persona.client.post("/v1/batches/estimate", body, format="json")


def ok(response):
    assert response.status_code == 200, response.content
    answer = response.json()
    assert answer["object"] == "openrelay.batch_estimate"
    return answer
