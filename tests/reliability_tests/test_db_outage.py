"""A worker outlives a lost database connection (batches/engine/dbretry.py).

The real restart is in test_crashes.py (PostgreSQL only); here the loss is
simulated on every backend: engine operations fail with OperationalError,
including after their transaction committed (the answer lost on the way
back), and the batch still completes in the same engine, every record once.
"""

import pytest
from django.db import OperationalError

from batches.engine import dbretry, store
from batches.engine.runner import run_batch
from batches.models import Batch
from tests.helpers import assert_exactly_once, chat, make_batch


def test_a_call_is_retried_until_the_database_answers(settings):
    settings.OPENRELAY_DB_OUTAGE_S = 5
    attempts = []

    def flaky():
        attempts.append(1)
        if len(attempts) < 3:
            raise OperationalError("server closed the connection unexpectedly")
        return "ok"

    assert dbretry.call(flaky) == "ok" and len(attempts) == 3


def test_it_gives_up_after_the_outage_limit(settings):
    settings.OPENRELAY_DB_OUTAGE_S = 0.3

    def down():
        raise OperationalError("connection refused")

    with pytest.raises(OperationalError):
        dbretry.call(down)


def test_other_errors_are_not_retried():
    calls = []

    def broken():
        calls.append(1)
        raise ValueError("a bug, not an outage")

    with pytest.raises(ValueError):
        dbretry.call(broken)
    assert calls == [1]


def _failing(monkeypatch, name, *, after_commit, times):
    """store.<name> raises OperationalError `times` times, before or after doing its work."""
    real = getattr(store, name)
    left = [times]

    def wrapper(*args, **kwargs):
        if left[0] and not after_commit:
            left[0] -= 1
            raise OperationalError("terminating connection due to administrator command")
        result = real(*args, **kwargs)
        if left[0]:
            left[0] -= 1
            raise OperationalError("server closed the connection unexpectedly")
        return result

    monkeypatch.setattr(store, name, wrapper)
    return left


def test_a_batch_survives_lost_connections_in_one_engine(alice, model, monkeypatch):
    batch = make_batch(alice.org, [chat(f"q{i}") for i in range(300)])
    # The engine flushes and claims in one transaction (store.trip): it fails
    # before its work, and after committing it (the answer lost on the way
    # back: the retry takes back the records that attempt leased). Its polls
    # and heartbeats fail too.
    left = [
        _failing(monkeypatch, "trip", after_commit=False, times=2),
        _failing(monkeypatch, "trip", after_commit=True, times=2),
        _failing(monkeypatch, "active_batches", after_commit=False, times=1),
        _failing(monkeypatch, "heartbeat", after_commit=True, times=1),
    ]
    run_batch(batch.pk)  # one engine, no sweeper
    assert [hits[0] for hits in left] == [0, 0, 0, 0], "the failures were not all hit"
    assert Batch.objects.get(pk=batch.pk).status == "completed"
    out, err = assert_exactly_once(batch, 300)
    assert err == []
