"""Fixtures for the quote tests: stored files in tmp_path, simulators with and without a tokenizer."""

import pytest

from openrelay.simulator.config import SimulatorConfig
from openrelay.simulator.server import run_in_thread


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
