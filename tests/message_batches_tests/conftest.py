"""Message Batches: the official anthropic SDK on pytest-django's live server, models on the simulator."""

import anthropic
import pytest

from openrelay.core.models import Deployment
from tests.helpers import deploy

TRANSLATED = "openrelay/claude-translated"
NATIVE = "openrelay/claude-native"

pytestmark = pytest.mark.usefixtures("tmp_storage")


@pytest.fixture
def claude(live_server, alice):
    """Anthropic's SDK as alice (x-api-key), without retries."""
    return anthropic.Anthropic(base_url=live_server.url, api_key=alice.key, max_retries=0)


@pytest.fixture
def translated(transactional_db, sim):
    """A model whose deployment only serves chat completions: Messages requests are translated."""
    return deploy(TRANSLATED, sim.base_url)


@pytest.fixture
def native(transactional_db, sim):
    """A model whose deployment serves /v1/messages itself: Messages requests pass through."""
    model = deploy(NATIVE, sim.base_url)
    Deployment.objects.filter(model=model).update(messages_api="native")
    return model


def request(custom_id, text="Hello", model=TRANSLATED, **params):
    return {
        "custom_id": custom_id,
        "params": {"model": model, "max_tokens": 64, "messages": [{"role": "user", "content": text}], **params},
    }
