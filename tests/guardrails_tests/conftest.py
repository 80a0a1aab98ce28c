"""Guardrails tests: stored files in tmp_path; engine tests talk to their own simulator."""

import pytest


@pytest.fixture(autouse=True)
def _storage(tmp_storage):
    """Every guardrails test keeps its stored files in tmp_path."""


@pytest.fixture
def sim(fresh_sim):
    """The test's own simulator (the one `model` is deployed on)."""
    return fresh_sim
