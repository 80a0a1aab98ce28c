"""Tool-loop fixtures: a real tool executor server, the simulated model, a record runner.

The executor server is an aiohttp app on 127.0.0.1 in its own thread. It
records every request it receives (path, query, headers, JSON body) and
answers as the test tells it: `executor.answer(a, b, ...)` uses the answers in
order and repeats the last one, so "ok on round 1, 500 on round 2" is
`executor.answer(ok(), status(500))`.
"""

import asyncio
import threading
from dataclasses import dataclass, field

import orjson
import pytest
from aiohttp import web

from batches.engine.calls.caller import ModelCaller, Upstream
from batches.engine.runner import RecordContext
from batches.engine.store import ClaimedRecord
from openrelay.lib.outbound import OutboundClient
from openrelay.simulator.server import AppThread

CHAT = "/v1/chat/completions"
SIM_MODEL = "sim-model"

# --- answers: async (request, payload) -> web.Response ---------------------------------


def default_content(call):
    return f"{call['function']['name']} result for {call['id']}"


def ok(content=default_content, reverse=False):
    """Answer every tool call; `content(call)` gives each result's content."""

    async def answer(request, payload):
        results = [{"tool_call_id": c["id"], "content": content(c)} for c in payload["tool_calls"]]
        return web.json_response({"results": results[::-1] if reverse else results})

    return answer


def status(code):
    async def answer(request, payload):
        return web.json_response({"error": "no"}, status=code)

    return answer


def sleep(seconds):
    async def answer(request, payload):
        await asyncio.sleep(seconds)
        return await ok()(request, payload)

    return answer


def raw(body, content_type="application/json"):
    """Answer 200 with these bytes (malformed JSON, wrong shapes, oversized bodies)."""

    async def answer(request, payload):
        return web.Response(body=body, content_type=content_type)

    return answer


def shaped(make_body):
    """Answer 200 with the JSON `make_body(payload)` returns."""

    async def answer(request, payload):
        return web.json_response(make_body(payload))

    return answer


def missing_result():
    """Answer every tool call but the last."""
    return shaped(lambda p: {"results": [{"tool_call_id": c["id"], "content": "x"} for c in p["tool_calls"][:-1]]})


def streamed(nbytes, chunk=1024 * 1024):
    """Answer 200 with `nbytes` sent chunked (no Content-Length): the cap must count while reading."""

    async def answer(request, payload):
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        sent = 0
        while sent < nbytes:
            await response.write(b" " * min(chunk, nbytes - sent))
            sent += chunk
        await response.write_eof()
        return response

    return answer


def per_record(answers, default=None):
    """Answer by the payload's custom_id (records of one batch run concurrently)."""
    default = default or ok()

    async def answer(request, payload):
        return await answers.get(payload["custom_id"], default)(request, payload)

    return answer


def redirect(location):
    async def answer(request, payload):
        return web.Response(status=302, headers={"Location": location})

    return answer


# --- the server -----------------------------------------------------------------


class ExecutorServer:
    """A real tool executor on 127.0.0.1 in a background thread."""

    def __init__(self):
        self.received = []
        self._answers = [ok()]
        self._lock = threading.Lock()
        self._server = None
        self.port = None

    @property
    def base(self):
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self):
        return f"{self.base}/tools"

    def answer(self, *answers):
        with self._lock:
            self._answers = list(answers)

    def reset(self):
        with self._lock:
            self.received = []
            self._answers = [ok()]

    def tool_call_ids(self):
        """Every tool_call_id received, request by request."""
        return [[c["id"] for c in r["json"]["tool_calls"]] for r in self.received]

    async def _handle(self, request):
        raw_body = await request.read()
        payload = orjson.loads(raw_body)
        with self._lock:
            self.received.append(
                {"path": request.path, "query": request.query_string, "headers": dict(request.headers), "json": payload}
            )
            answer = self._answers.pop(0) if len(self._answers) > 1 else self._answers[0]
        return await answer(request, payload)

    def start(self):
        app = web.Application(client_max_size=50 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # handler_cancellation (AppThread's runner): a sleeping answer ends when the client gives up.
        self._server = AppThread(app, name="tool-executor").start()
        self.port = self._server.port
        return self

    def stop(self):
        self._server.stop()


@pytest.fixture(scope="session")
def executor_server():
    server = ExecutorServer().start()
    yield server
    server.stop()


@pytest.fixture
def executor(executor_server):
    executor_server.reset()
    return executor_server




# --- running one record by hand ---------------------------------------------------


class RecordingCaller(ModelCaller):
    """The real ModelCaller, keeping every CallResult so tests can sum usage themselves."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.results = []

    async def call(self, endpoint, body):
        result = await super().call(endpoint, body)
        self.results.append(result)
        return result


@dataclass
class Run:
    outcome: object
    model_results: list = field(default_factory=list)


def record_context(caller, outbound):
    return RecordContext(
        batch_pk=1, batch_public_id="batch_test", organization_id=1, endpoint=CHAT, model_name=SIM_MODEL,
        caller=caller, outbound=outbound,
    )


@pytest.fixture
def run_record(sim):
    """run_record(body, ...) -> Run: one record through `entry` (toolloop.run by default)."""

    def run(body, *, entry=None, time_limit_s=10.0, allow_private=True, custom_id="req-1"):
        if entry is None:
            from batches.engine.loops.toolloop import run as entry

        async def go():
            caller = RecordingCaller([Upstream(sim.base_url, SIM_MODEL, "", 8)], time_limit_s=time_limit_s, retries=0)
            async with caller, OutboundClient(allow_private=allow_private) as outbound:
                ctx = record_context(caller, outbound)
                outcome = await entry(ctx, ClaimedRecord(1, 1, custom_id, 0, 0), body)
            return Run(outcome, caller.results)

        return asyncio.run(go())

    return run
