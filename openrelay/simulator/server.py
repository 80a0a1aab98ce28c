"""The HTTP side of the simulator: the aiohttp app, in a thread or blocking.

`ModelServer`'s handlers (a model call goes through the fault directives, the
capacity model and the answers; `/v1/models`, `/_sim/*`, `/metrics`),
`build_app` and its runner, `AppThread` (any aiohttp app on its own event loop
in a thread, which tests use for their peers) with `SimulatorThread` and
`run_in_thread` on top, and `serve`, which runs the server until SIGINT or
SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import multiprocessing
import signal
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, Self

import orjson
from aiohttp import web

from openrelay.lib import aio, request_schemas
from openrelay.lib.request_schemas import RequestSchema
from openrelay.simulator.answers import (
    BadRequest,
    answer_chat,
    answer_completion,
    answer_embeddings,
    answer_moderations,
    answer_responses,
    built_apart,
    count_tokens,
    embedding_numbers,
    error_envelope,
)
from openrelay.simulator.bodies import (
    chat_messages,
    chat_text,
    completion_text,
    embedding_text,
    moderation_text,
    response_text,
)
from openrelay.simulator.capacity import (
    BLOCK_TOKENS,
    CapacityModel,
    Overloaded,
    chat_prefix_text,
    completion_prefix_text,
    prefix_blocks,
    report_cached_tokens,
    response_prefix_text,
    usage_counts,
)
from openrelay.simulator.config import SimulatorConfig
from openrelay.simulator.directives import FaultDirectives, parse_fault_directives
from openrelay.simulator.faults import ANSWER, DROP, FAIL, HANG, choose_outcome, seeded_draw
from openrelay.simulator.messages import answer_messages, messages_text
from openrelay.simulator.metrics import PROMETHEUS_CONTENT_TYPE, render_metrics
from openrelay.simulator.state import SimulatorState

MODELS_CREATED = 1_700_000_000
# An answer carrying this many numbers or more is built in a child process (`ModelServer._built`). Built
# on the loop, one embeddings answer of 2,048 x 3,072 held every other call for 12-13 s on a loaded
# machine (and 16 of them, one after another, ~200 s): another organization's small calls beside them
# took 34 s to be answered (issue 55, bench row 15), where a real server answers them at once.
HEAVY_NUMBERS = 1_000_000
BUILDERS = 2  # child processes building heavy answers (started at the first one)


# ---------------------------------------------------------------- responses


def json_response(payload: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(payload), status=status, content_type="application/json", headers=headers)


def _answer_response(payload: Any, built: bytes | None) -> web.Response:
    """A 200 with the answer: its JSON text when it was built apart (ModelServer._built)."""
    if built is None:
        return json_response(payload)
    return web.Response(body=built, content_type="application/json")


def failure_response(config: SimulatorConfig, status: int, model: Any = None) -> web.Response:
    headers = None
    if status == 429:
        retry_after = config.retry_after_s if config.retry_after_s is not None else 1
        headers = {
            "Retry-After": f"{retry_after:g}",
            "retry-after-ms": str(int(retry_after * 1000)),
        }
    message = f"The model `{model}` does not exist." if status == 404 and isinstance(model, str) else None
    return json_response(error_envelope(status, message), status=status, headers=headers)


MESSAGES_PATH = "/v1/messages"
# Anthropic's error types by status, as its Messages API (and vLLM's /v1/messages) answers them.
ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def anthropic_error(response: web.Response) -> None:
    """An error answer of /v1/messages in Anthropic's envelope: {"type": "error", "error": {"type", "message"}}."""
    try:
        error = orjson.loads(response.body)["error"]  # type: ignore[arg-type]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return
    kind = ANTHROPIC_ERROR_TYPES.get(response.status, "api_error")
    response.body = orjson.dumps({"type": "error", "error": {"type": kind, "message": error.get("message", "")}})


# ---------------------------------------------------------------- the server


@dataclass(frozen=True)
class ModelEndpoint:
    text_of: Callable[[dict[str, Any]], str]  # body -> the text searched for fault directives
    answer: Callable[[dict[str, Any]], dict[str, Any]]  # body -> answer payload (raises BadRequest)
    prefix_of: Callable[[dict[str, Any]], str] | None = None  # body -> the text the prefix cache sees (None: no cache)
    # The request type the provider publishes (openrelay.lib.request_schemas): a body a real server refuses
    # is refused here too, 400 in the endpoint's envelope, so no test passes on a body no server would take.
    schema: RequestSchema | None = None
    numbers_of: Callable[[dict[str, Any]], int] | None = None  # body -> numbers its answer carries (None: few)


MODEL_ENDPOINTS = {
    "/v1/chat/completions": ModelEndpoint(chat_text, answer_chat, chat_prefix_text, request_schemas.CHAT),
    "/v1/completions": ModelEndpoint(
        completion_text, answer_completion, completion_prefix_text, request_schemas.COMPLETIONS
    ),
    "/v1/embeddings": ModelEndpoint(
        embedding_text, answer_embeddings, schema=request_schemas.EMBEDDINGS, numbers_of=embedding_numbers
    ),
    "/v1/responses": ModelEndpoint(response_text, answer_responses, response_prefix_text, request_schemas.RESPONSES),
    "/v1/moderations": ModelEndpoint(moderation_text, answer_moderations, schema=request_schemas.MODERATIONS),
    "/v1/messages": ModelEndpoint(messages_text, answer_messages, messages_text, request_schemas.MESSAGES),
}


class ModelServer:
    """The request handlers, bound to one config and one state."""

    def __init__(self, config: SimulatorConfig):
        self.config = config
        self.state = SimulatorState(config)
        self.capacity = CapacityModel(config)
        self._parked: set[asyncio.Task[Any]] = set()
        self._builders: ProcessPoolExecutor | None = None  # heavy answers' child processes (`_built`)

    async def model_call(self, request: web.Request) -> web.StreamResponse:
        self.state.entered(request.remote)
        try:
            response = await self._model_call(request)
        finally:
            self.state.left(request.remote)
        if request.path == MESSAGES_PATH and response.status >= 400 and isinstance(response, web.Response):
            anthropic_error(response)
        return response

    async def _model_call(self, request: web.Request) -> web.StreamResponse:
        endpoint = MODEL_ENDPOINTS[request.path]
        raw = await request.read()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = None
        # An unparsable body is recorded as text: tests want to see what came.
        recorded = body if body is not None else raw.decode(errors="replace")
        self.state.record(request.path, request.headers, recorded, request.remote)
        if not self._authorized(request):
            return json_response(error_envelope(401, "Invalid API key."), 401)
        if not isinstance(body, dict):
            return json_response(error_envelope(400, "The body must be a JSON object."), 400)
        problem = endpoint.schema.problem(body) if endpoint.schema is not None else None
        if problem is not None:
            return json_response(error_envelope(400, problem.message, problem.param), 400)
        text = endpoint.text_of(body)
        directives = parse_fault_directives(text)
        outcome, status = self._decide(directives, raw)
        delay_ms = self.config.latency_ms + directives.latency_ms
        if delay_ms > 0 and outcome != HANG:
            await self._park(delay_ms / 1000)
        if outcome == ANSWER and self.config.slots:
            return await self._answer_in_a_slot(endpoint, body, text)
        if outcome == ANSWER:
            return await self._answer(endpoint, body)
        if outcome == FAIL:
            assert status is not None  # choose_outcome gives every FAIL its status
            return failure_response(self.config, status, body.get("model"))
        if outcome == DROP:
            return await self._drop(request)
        return await self._hang()

    def _decide(self, directives: FaultDirectives, raw: bytes) -> tuple[str, int | None]:
        seen, draw = 0, None
        if directives.counts_repeats or self.config.draws_at_random:
            body_hash = hashlib.blake2b(raw, digest_size=16).digest()
            seen = self.state.times_seen(body_hash)
            if self.config.draws_at_random:
                draw = seeded_draw(self.config.seed, body_hash, seen)
        return choose_outcome(self.config, directives, seen, draw)

    async def _answer(self, endpoint: ModelEndpoint, body: dict[str, Any]) -> web.Response:
        try:
            payload, built = await self._built(endpoint, body)
        except BadRequest as exc:
            return json_response(error_envelope(400, str(exc), exc.param), 400)
        return _answer_response(payload, built)

    async def _built(self, endpoint: ModelEndpoint, body: dict[str, Any]) -> tuple[dict[str, Any], bytes | None]:
        """The answer's payload, and None; or, for an answer of HEAVY_NUMBERS or more, built apart in a
        child process so this loop answers every other call meanwhile: its JSON text, and a payload
        holding only its usage (what the capacity model reads; embeddings carry no cached tokens to
        report). Raises BadRequest."""
        if endpoint.numbers_of is None or endpoint.numbers_of(body) < HEAVY_NUMBERS:
            return endpoint.answer(body), None
        if self._builders is None:
            # spawn: a fork of this process would copy its loop and sockets into the child.
            self._builders = ProcessPoolExecutor(BUILDERS, mp_context=multiprocessing.get_context("spawn"))
        loop = asyncio.get_running_loop()
        text, usage, refused = await loop.run_in_executor(self._builders, built_apart, endpoint.answer, body)
        if refused is not None:
            raise BadRequest(*refused)
        return {"usage": usage}, text

    async def close_builders(self, _app: web.Application) -> None:
        if self._builders is not None:
            self._builders.shutdown(wait=False, cancel_futures=True)

    async def _answer_in_a_slot(self, endpoint: ModelEndpoint, body: dict[str, Any], text: str) -> web.Response:
        # The answer is known before the slot (a 400 never queues); the slot
        # only decides when it goes out and how much of the prompt was cached.
        try:
            payload, built = await self._built(endpoint, body)
        except BadRequest as exc:
            return json_response(error_envelope(400, str(exc), exc.param), 400)
        prompt_tokens, completion_tokens = usage_counts(payload)
        if prompt_tokens is None:  # moderations carry no usage
            prompt_tokens = count_tokens(text)
        keys = None
        if self.config.prefix_cache_tokens and endpoint.prefix_of is not None:
            keys = prefix_blocks(endpoint.prefix_of(body), prompt_tokens // BLOCK_TOKENS)
        try:
            with self._parking():
                cached = await self.capacity.serve(prompt_tokens, completion_tokens, keys)
        except Overloaded as exc:
            # Retry-After, as an overloaded server says when to come back (RFC 9110, 503).
            retry_after = self.config.retry_after_s if self.config.retry_after_s is not None else 1
            headers = {"Retry-After": f"{retry_after:g}"}
            return json_response(error_envelope(503, str(exc)), 503, headers=headers)
        report_cached_tokens(payload, cached)
        return _answer_response(payload, built)

    async def _drop(self, request: web.Request) -> web.StreamResponse:
        # abort() rather than close(): no graceful shutdown, the client sees
        # the connection end without a response, like a crashed upstream.
        if request.transport is not None:
            request.transport.abort()
        raise asyncio.CancelledError  # ends the handler without writing anything

    async def _hang(self) -> web.StreamResponse:
        await self._park(None)
        raise AssertionError("unreachable: parking forever only ends by cancellation")

    async def _park(self, seconds: float | None) -> None:
        """Sleep (forever when seconds is None) where shutdown can cut it short."""
        with self._parking():
            if seconds is None:
                await asyncio.get_running_loop().create_future()
            else:
                await asyncio.sleep(seconds)

    @contextlib.contextmanager
    def _parking(self) -> Iterator[None]:
        """Let wake_parked cancel this task while it waits inside the block."""
        task = asyncio.current_task()
        assert task is not None  # aiohttp runs every handler in a task of its own
        self._parked.add(task)
        try:
            yield
        finally:
            self._parked.discard(task)

    async def wake_parked(self, app: web.Application | None = None) -> None:
        # Hung, sleeping, queued and slot-holding handlers would otherwise
        # hold shutdown for the whole shutdown timeout.
        for task in list(self._parked):
            task.cancel()

    def _authorized(self, request: web.Request) -> bool:
        return not self.config.api_key or request.headers.get("Authorization") == f"Bearer {self.config.api_key}"

    async def list_models(self, request: web.Request) -> web.StreamResponse:
        if not self._authorized(request):
            return json_response(error_envelope(401, "Invalid API key."), 401)
        if self.config.drop_all:
            return await self._drop(request)
        if self.config.fail_all_status:
            return failure_response(self.config, self.config.fail_all_status)
        data = [
            {"id": name, "object": "model", "created": MODELS_CREATED, "owned_by": "openrelay-sim"}
            for name in self.config.models
        ]
        return json_response({"object": "list", "data": data})

    async def recorded_requests(self, request: web.Request) -> web.Response:
        return json_response(self.state.requests(request.query.get("path")))

    async def reset(self, request: web.Request) -> web.Response:
        self.forget()
        return json_response({"reset": True})

    def forget(self) -> None:
        """Recorded calls, per-body counters, capacity figures and prefix cache."""
        self.state.reset()
        self.capacity.reset()

    async def stats(self, request: web.Request) -> web.Response:
        return json_response(self.capacity.stats())

    async def calls(self, request: web.Request) -> web.Response:
        return json_response(self.state.calls())

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        # llama-server asks for its API key on /metrics; vLLM's key guards /v1 only.
        if self.config.metrics == "llamacpp" and not self._authorized(request):
            return json_response(error_envelope(401, "Invalid API key."), 401)
        if self.config.drop_all:
            return await self._drop(request)
        if self.config.fail_all_status:
            return failure_response(self.config, self.config.fail_all_status)
        text = render_metrics(self.config, self.capacity.stats())
        return web.Response(body=text.encode(), headers={"Content-Type": PROMETHEUS_CONTENT_TYPE})

    async def tokenize(self, request: web.Request) -> web.Response:
        """vLLM's POST /tokenize ({"messages"} or {"prompt"} -> "count") or llama.cpp's raw-text one
        ({"content"} -> "tokens" only), counted by the rule the answers report their prompt_tokens with."""
        body = await self._tokenizer_body(request)
        if isinstance(body, web.Response):
            return body
        if self.config.tokenizer == "llamacpp":
            content = body.get("content")
            text = content if isinstance(content, str) else ""
            return json_response({"tokens": list(range(count_tokens(text) if text else 0))})
        if isinstance(body.get("messages"), list):
            count = count_tokens(chat_text(body))
        elif isinstance(body.get("prompt"), str):
            count = count_tokens(body["prompt"])
        else:
            return json_response(error_envelope(400, "Either 'messages' or 'prompt' is required."), 400)
        return json_response({"count": count, "max_model_len": 8192, "tokens": list(range(count))})

    async def chat_input_tokens(self, request: web.Request) -> web.Response:
        """llama.cpp's POST /v1/chat/completions/input_tokens: the chat request's prompt tokens, as its call reports."""
        body = await self._tokenizer_body(request)
        if isinstance(body, web.Response):
            return body
        if not chat_messages(body):
            return json_response(error_envelope(400, "messages must be a non-empty array", "messages"), 400)
        return json_response({"input_tokens": count_tokens(chat_text(body))})

    async def _tokenizer_body(self, request: web.Request) -> dict[str, Any] | web.Response:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            body = None
        self.state.record(request.path, request.headers, body)
        if not self._authorized(request):
            return json_response(error_envelope(401, "Invalid API key."), 401)
        if self.config.fail_all_status:
            return failure_response(self.config, self.config.fail_all_status)
        if not isinstance(body, dict):
            return json_response(error_envelope(400, "The body must be a JSON object."), 400)
        return body

    async def not_found(self, request: web.Request) -> web.Response:
        message = f"Invalid URL ({request.method} {request.path})"
        return json_response(error_envelope(404, message), 404)


SERVER_KEY = web.AppKey("model_server", ModelServer)


def build_app(config: SimulatorConfig | None = None) -> web.Application:
    """The aiohttp application; `app[SERVER_KEY].state` holds the recordings."""
    server = ModelServer(config or SimulatorConfig())
    # Request bodies (embedding inputs, long chats) can exceed aiohttp's 1 MB default.
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[SERVER_KEY] = server
    for path in MODEL_ENDPOINTS:
        app.router.add_post(path, server.model_call)
    app.router.add_get("/v1/models", server.list_models)
    app.router.add_get("/_sim/requests", server.recorded_requests)
    app.router.add_post("/_sim/reset", server.reset)
    app.router.add_get("/_sim/stats", server.stats)
    app.router.add_get("/_sim/calls", server.calls)
    if server.config.metrics:
        app.router.add_get("/metrics", server.metrics)
    if server.config.tokenizer:
        app.router.add_post("/tokenize", server.tokenize)
    if server.config.tokenizer == "llamacpp":
        app.router.add_post("/v1/chat/completions/input_tokens", server.chat_input_tokens)
    app.router.add_route("*", "/{tail:.*}", server.not_found)
    app.on_shutdown.append(server.wake_parked)
    app.on_cleanup.append(server.close_builders)
    # Built before the server answers (seconds, once a process: the SDKs' import and pydantic's schemas), so
    # no request waits for it: a first call's latency is the simulator's, as tests of timeouts expect.
    for endpoint in MODEL_ENDPOINTS.values():
        if endpoint.schema is not None:
            endpoint.schema.validator  # noqa: B018  # built and kept (request_schemas.RequestSchema)
    return app


def make_runner(app: web.Application) -> web.AppRunner:
    # No access log (it halves throughput); cancel handlers whose client went
    # away so hung requests do not pile up; a short shutdown never waits long.
    return web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0)


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


# ---------------------------------------------------------------- in a thread


class AppThread:
    """Any aiohttp application on its own event loop in a background thread.

    Tests use it for their peers (the simulator, tool executors, workflow
    callbacks). A context manager, or start() and stop() (pytest fixtures).
    """

    def __init__(self, app: web.Application, host: str = "127.0.0.1", port: int = 0, name: str = "aiohttp"):
        self.app = app
        self.host = host
        self.name = name
        self._requested_port = port
        self.port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> Self:
        if self._thread is not None:
            return self
        sock = bind_socket(self.host, self._requested_port)
        self.port = sock.getsockname()[1]
        # Daemon: a test that forgets stop() must not keep the interpreter alive.
        self._thread = threading.Thread(target=self._run, args=(sock,), name=f"{self.name}:{self.port}", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._startup_error is not None:
            raise RuntimeError(f"{self.name} server failed to start") from self._startup_error
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        if self._loop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _run(self, sock: socket.socket) -> None:
        loop = self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        runner = make_runner(self.app)
        try:
            loop.run_until_complete(_start_site(runner, sock))
        except BaseException as exc:  # noqa: BLE001 - reported to start() in the caller's thread
            self._startup_error = exc
            self._ready.set()
            sock.close()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(runner.cleanup())
            _cancel_leftover_tasks(loop)
            loop.close()


class SimulatorThread(AppThread):
    """A simulator in a background thread (for tests)."""

    def __init__(self, config: SimulatorConfig | None = None, host: str = "127.0.0.1", port: int = 0) -> None:
        self.config = config or SimulatorConfig()
        super().__init__(build_app(self.config), host, port, name="simulator")
        self.state = self.app[SERVER_KEY].state

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def requests(self, path: str | None = None) -> list[dict[str, Any]]:
        """Recorded calls `{"path", "headers", "body"}`, oldest first."""
        return self.state.requests(path)

    def bodies(self, path: str | None = None) -> list[Any]:
        return [r["body"] for r in self.state.requests(path)]

    @property
    def request_count(self) -> int:
        """Model calls since start or reset (counted even when not recorded)."""
        return self.state.request_count

    def reset(self) -> None:
        self.app[SERVER_KEY].forget()

    def stats(self) -> dict[str, Any]:
        """The capacity model's figures, as `GET /_sim/stats` answers."""
        return self.app[SERVER_KEY].capacity.stats()


def run_in_thread(config: SimulatorConfig | None = None, *, host: str = "127.0.0.1", port: int = 0) -> SimulatorThread:
    """A simulator for tests: `with run_in_thread(cfg) as sim:` or `.start()`."""
    return SimulatorThread(config, host, port)


async def _start_site(runner: web.AppRunner, sock: socket.socket) -> None:
    await runner.setup()
    await web.SockSite(runner, sock).start()


def _cancel_leftover_tasks(loop: asyncio.AbstractEventLoop) -> None:
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())


# ---------------------------------------------------------------- blocking serve


def serve(config: SimulatorConfig | None = None, host: str = "127.0.0.1", port: int = 8001) -> None:
    """Run until SIGINT/SIGTERM; prints where it listens."""
    try:
        aio.run(_serve_until_signal(config or SimulatorConfig(), host, port))
    except KeyboardInterrupt:
        pass


async def _serve_until_signal(config: SimulatorConfig, host: str, port: int) -> None:
    sock = bind_socket(host, port)
    # Listening before build_app builds the request checks (seconds): a client that connects meanwhile waits
    # in the backlog for its answer instead of being refused (`manage.py up` starts its workers beside it).
    sock.listen(128)
    runner = make_runner(build_app(config))
    await _start_site(runner, sock)
    print(f"Simulated model server on http://{host}:{sock.getsockname()[1]}/v1", flush=True)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(signum, stopping.set)
        except (NotImplementedError, RuntimeError):  # not the main thread, or Windows
            pass
    try:
        await stopping.wait()
    finally:
        await runner.cleanup()
