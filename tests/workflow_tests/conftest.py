"""Workflow fixtures: a real callback server and the simulated model, both on 127.0.0.1.

`callback` is a workflow callback in a background thread. It records every
payload and its headers, and answers from the test's script: a function of
the payload (or a list, one answer per step) returning a JSON value to send
with 200, or a `Reply` for anything else (another status, raw bytes, no
answer at all).
"""

import asyncio
import time
from dataclasses import dataclass, field

import orjson
import pytest
from aiohttp import web

from batches.engine.calls.caller import ModelCaller, Upstream
from batches.engine.loops import workflow
from batches.engine.runner import RecordContext
from batches.engine.store import ClaimedRecord
from openrelay.lib.outbound import OutboundClient
from openrelay.simulator.server import AppThread

MODEL = "openrelay/gemma-4-31b"
ENDPOINT = "/v1/chat/completions"


@dataclass
class Reply:
    status: int = 200
    raw: bytes = b""
    hang: bool = False
    headers: dict = field(default_factory=dict)


@dataclass
class Call:
    payload: object
    headers: dict
    received_at: float
    answered_at: float = 0.0


@dataclass
class CallbackServer:
    """A workflow callback endpoint at `url`, answering from `script`."""

    calls: list = field(default_factory=list)
    script: object = None
    port: int = 0

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}/workflow"

    @property
    def payloads(self):
        return [call.payload for call in self.calls]

    def answer(self, script):
        """Answer every callback with script(payload), or with script[step - 1] for a list."""
        self.script = script

    def reset(self):
        self.calls = []
        self.script = None

    async def handle(self, request):
        call = Call(orjson.loads(await request.read()), dict(request.headers), time.monotonic())
        self.calls.append(call)
        script = self.script
        answer = script[call.payload["step"] - 1] if isinstance(script, list) else script(call.payload)
        if isinstance(answer, Reply) and answer.hang:
            await asyncio.get_running_loop().create_future()  # cancelled when the client gives up
        call.answered_at = time.monotonic()
        if isinstance(answer, Reply):
            return web.Response(status=answer.status, body=answer.raw, content_type="application/json",
                                headers=answer.headers)
        return web.Response(body=orjson.dumps(answer), content_type="application/json")


@pytest.fixture(scope="session")
def callback_server():
    app = web.Application()
    server = CallbackServer()
    app.router.add_post("/workflow", server.handle)
    with AppThread(app, name="workflow-callback") as thread:
        server.port = thread.port
        yield server


@pytest.fixture
def callback(callback_server):
    callback_server.reset()
    yield callback_server
    callback_server.reset()




def chat(content, **extra):
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}


def workflow_body(url, content="List the line items.", **workflow_fields):
    return {**chat(content), "openrelay": {"workflow": {"url": url, **workflow_fields}}}


def run_workflow(sim, body, *, custom_id="inv-0042", time_limit_s=5.0, allow_private=True, workflows_enabled=True):
    """Run one workflow record against the simulator, as the engine would; returns its RecordOutcome."""

    async def scenario():
        caller = ModelCaller([Upstream(sim.base_url, "sim-upstream", "", 8)], time_limit_s=time_limit_s, retries=0)
        async with caller, OutboundClient(allow_private=allow_private) as outbound:
            ctx = RecordContext(
                batch_pk=1, batch_public_id="batch_test", organization_id=1, endpoint=ENDPOINT, model_name=MODEL,
                caller=caller, workflows_enabled=workflows_enabled, outbound=outbound,
            )
            record = ClaimedRecord(pk=1, line=1, custom_id=custom_id, offset=0, length=0)
            return await workflow.run(ctx, record, body)

    return asyncio.run(scenario())
