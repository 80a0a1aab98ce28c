"""Engine fixtures: files in tmp_path, and each test's own simulator as `sim`.

The catalog `model`, `clusters` and the helpers (chat, make_batch, wait_for, ...)
are shared: tests/fixtures/ and tests/helpers.py.
"""

import pytest

from batches.engine.liveness import Liveness


@pytest.fixture(autouse=True)
def _storage(tmp_storage):
    """Every engine test keeps its stored files in tmp_path."""


@pytest.fixture
def sim(fresh_sim):
    """Overrides the session's `sim`: engine tests talk to `model`'s simulator, one of the test's own."""
    return fresh_sim


@pytest.fixture
def no_proxies(monkeypatch):
    """No proxy variables in the environment (either letter case); returns monkeypatch."""
    for name in (
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "http_proxy",
        "https_proxy",
        "no_proxy",
        "ALL_PROXY",
        "all_proxy",
    ):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def engines(transactional_db):
    """make(name): a live engine's Liveness with its first beat written; all closed after the test."""
    made = []

    def make(name):
        made.append(Liveness(name))
        made[-1].beat({}, True)
        return made[-1]

    yield make
    for liveness in made:
        liveness.close()
