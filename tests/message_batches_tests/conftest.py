"""Message Batches: the official anthropic SDK on pytest-django's live server, models on the simulator.

The SDK client and the models (claude, translated, native) are shared fixtures: tests/fixtures/message_batches.py.
"""

import pytest

from tests.fixtures.message_batches import NATIVE, TRANSLATED

__all__ = ["NATIVE", "TRANSLATED", "request"]

pytestmark = pytest.mark.usefixtures("tmp_storage")


def request(custom_id, text="Hello", model=TRANSLATED, **params):
    return {
        "custom_id": custom_id,
        "params": {"model": model, "max_tokens": 64, "messages": [{"role": "user", "content": text}], **params},
    }
