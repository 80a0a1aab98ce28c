"""Webhooks tests store files under tmp_path; the receiver is shared (tests/fixtures/webhook_receiver.py)."""

import pytest


@pytest.fixture(autouse=True)
def _storage(tmp_storage):
    """Every webhooks test keeps its stored files in tmp_path."""
