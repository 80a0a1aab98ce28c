"""A real webhook receiver on 127.0.0.1 (an aiohttp app in a thread) that records what reached it."""

from dataclasses import dataclass, field

import openai
import pytest
from aiohttp import web

from openrelay.simulator.server import AppThread
from tests.engine_tests.conftest import (  # noqa: F401  (fixtures for engine runs)
    _storage,
    clusters,
    model,
    sim,
)


@dataclass
class Received:
    headers: dict
    body: bytes


@dataclass
class Receiver:
    url: str
    received: list = field(default_factory=list)
    statuses: list = field(default_factory=list)  # answers to give, in order; then 200


@pytest.fixture
def receiver(settings):
    settings.OPENRELAY_ALLOW_PRIVATE_URLS = True  # the receiver is on loopback
    state = Receiver(url="")

    async def hook(request):
        state.received.append(Received({k.lower(): v for k, v in request.headers.items()}, await request.read()))
        return web.Response(status=state.statuses.pop(0) if state.statuses else 200)

    app = web.Application()
    app.router.add_post("/hooks", hook)
    with AppThread(app, name="webhook-receiver") as thread:
        state.url = f"{thread.url}/hooks"
        yield state


@pytest.fixture
def verifier():
    """The OpenAI SDK's own check of a delivery: client.webhooks.unwrap(body, headers, secret=...)."""
    return openai.OpenAI(api_key="unused", base_url="http://127.0.0.1:9/v1").webhooks
