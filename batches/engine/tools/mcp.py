"""The "mcp" executor: a record's tool calls as MCP tools/call requests.

The server speaks Streamable HTTP (MCP 2025-03-26 or later): every JSON-RPC
message is one POST to the server's endpoint, answered with
``application/json`` or a finite ``text/event-stream``. Everything goes out
through openrelay.lib.outbound (the guard for user URLs), which reads the whole
body; that is fine for a stream the server closes after its response.

Once per record loop, lazily on the first execute(), the executor sends
``initialize`` and then ``notifications/initialized``, and keeps what the
server gave: an ``Mcp-Session-Id`` (sent on every later request) and the
negotiated protocol version (sent as ``MCP-Protocol-Version``). Choices:

* A server answering ``initialize`` with HTTP 404 or 405 has no handshake
  (a stateless server): tools/call is sent directly, with neither header
  (the server then assumes 2025-03-26). Any other failing status fails the
  record, so a 401/403 never turns into an unauthenticated run.
* A 404 to a request that carried a session id means the server forgot the
  session (restart, idle expiry, another replica). The spec says the client
  MUST start a new one, so the executor re-initializes and retries that
  call once; the server never ran the call it refused.
* The tool content is the result's ``text`` content items joined with "\\n"
  (the official server turns a list into one text item per element; the
  newline keeps them apart). Other item types are skipped. ``isError: true``
  is delivered the same way: the model sees the error text and can react.
* The calls of one turn run concurrently (they are independent by the
  model's contract), at most ``parallel`` at once
  (OPENRELAY_TOOL_PARALLEL_CALLS); the others wait their turn within the
  record. The first failure cancels the rest and fails the record.
  Arguments are checked for all calls before any is sent. Every request
  also holds one of the organization's outbound slots (``tenant``;
  openrelay.lib.outbound.Slots), so a turn of 64 calls on a server that
  never answers holds ``parallel`` of them, not the engine.
* When the record's loop ends, close() ends the session with ``DELETE``
  and the session id (the spec's SHOULD), so servers don't keep one session
  per record until their idle expiry (30 minutes in the official SDK). It is
  best effort within CLOSE_TIMEOUT_S: any answer (405 from a server that
  doesn't allow it, 404 for a session already gone) or failure leaves the
  record's outcome as it was.
* Server-to-client requests on a stream (sampling, elicitation) are never
  answered: the worker declares no capabilities, so servers should not send
  them; one that waits for an answer runs into timeout_ms.

Failure messages go into the error file: they say which step failed and why,
and never carry a header value (authorization, session id). Text that comes
from the server (JSON-RPC error messages, tool contents) goes through
openrelay.lib.redaction, which removes both (any letter case, any piece of 8
characters or more) before a message is cut short.
"""

from __future__ import annotations

import asyncio
import codecs
import itertools
import re
import secrets
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from importlib import metadata
from typing import Any, TypeGuard

import orjson

from batches.engine.checkpoints import idempotency_key
from batches.engine.tools.base import ToolExecutionFailed, ToolResult
from openrelay.lib.outbound import OutboundClient, OutboundError, OutboundResponse
from openrelay.lib.redaction import redact, secrets_of

PROTOCOL_VERSION = "2025-06-18"
# Revisions with Streamable HTTP and the initialize handshake. A server may
# answer with any of them; anything else (an older or sessionless revision)
# we cannot speak, and the spec says to give up.
SUPPORTED_VERSIONS = frozenset({"2025-03-26", "2025-06-18", "2025-11-25"})
ACCEPT = "application/json, text/event-stream"
CLIENT_NAME = "openrelay-batch-worker"
NO_HANDSHAKE_STATUSES = (404, 405)
MAX_SERVER_TEXT = 300
DEFAULT_TIMEOUT_MS = 30_000
DEFAULT_PARALLEL = 8  # OPENRELAY_TOOL_PARALLEL_CALLS' default
CLOSE_TIMEOUT_S = 5.0

_SESSION_ID = re.compile(r"[\x21-\x7e]+")


def _client_version() -> str:
    try:
        return metadata.version("openrelay-batch")
    except metadata.PackageNotFoundError:
        return "0.0.0"


CLIENT_VERSION = _client_version()


class McpExecutor:
    """Runs one record's tool calls against one MCP server, across rounds."""

    def __init__(
        self,
        outbound: OutboundClient,
        custom_id: str,
        tool_config: dict[str, Any],
        *,
        tenant: Hashable | None = None,
        parallel: int = DEFAULT_PARALLEL,
    ) -> None:
        self.outbound = outbound
        self.custom_id = custom_id
        self.tenant = tenant  # whose outbound slots the requests hold (the organization)
        self.parallel = parallel
        self.url = tool_config["url"]
        self.authorization = tool_config.get("authorization") or None
        self.context = tool_config.get("context")
        self.timeout_s = (tool_config.get("timeout_ms") or DEFAULT_TIMEOUT_MS) / 1000
        self.session_id: str | None = None
        self.protocol_version: str | None = None
        self._ready = False
        self._lock = asyncio.Lock()
        self._ids = itertools.count(1)

    async def execute(self, tool_calls: list[dict[str, Any]], key: str | None = None) -> list[ToolResult]:
        calls = [self._prepare(tc) for tc in tool_calls]
        if not calls:
            return []
        await self._ensure_session()
        # Each tools/call's Idempotency-Key: the round's key and the call's place in the turn.
        keys = [idempotency_key(f"{key}:call:{index}") if key else None for index in range(len(calls))]
        turns = asyncio.Semaphore(self.parallel)

        async def in_turn(call: tuple[str, str, dict[str, Any]], call_key: str | None) -> ToolResult:
            async with turns:
                return await self._call(*call, key=call_key)

        tasks = [asyncio.create_task(in_turn(call, call_key)) for call, call_key in zip(calls, keys)]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def close(self) -> None:
        try:
            if self.session_id:
                # Best effort, so the wait for a slot is as short as the call.
                await self.outbound.delete(
                    self.url,
                    headers=self._headers(),
                    timeout_s=min(self.timeout_s, CLOSE_TIMEOUT_S),
                    accept=ACCEPT,
                    tenant=self.tenant,
                    slot_wait_s=CLOSE_TIMEOUT_S,
                )
        except OutboundError:
            pass  # best effort: the server expires the session on its own
        finally:
            self.session_id = self.protocol_version = None
            self._ready = False

    # --- tool calls ------------------------------------------------------

    def _prepare(self, tool_call: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
        function = tool_call.get("function") if isinstance(tool_call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(function, dict) or not isinstance(name, str) or not name:
            raise ToolExecutionFailed("MCP tools/call failed: a tool call has no function name")
        raw = function.get("arguments")
        if isinstance(raw, str):
            # Some model servers send "" for a function without parameters.
            try:
                arguments = orjson.loads(raw) if raw.strip() else {}
            except orjson.JSONDecodeError:
                raise ToolExecutionFailed(
                    f"MCP tools/call {_quote(name)} failed: the arguments are not valid JSON"
                ) from None
        else:
            arguments = raw
        if not isinstance(arguments, dict):
            raise ToolExecutionFailed(f"MCP tools/call {_quote(name)} failed: the arguments are not a JSON object")
        if self.context is not None:
            arguments = {**arguments, "_context": self.context}
        return str(tool_call.get("id", "")), name, arguments

    async def _call(self, call_id: str, name: str, arguments: dict[str, Any], key: str | None = None) -> ToolResult:
        step = f"tools/call {_quote(name)}"
        params = {"name": name, "arguments": arguments}
        session = self.session_id
        rid, response = await self._send_request("tools/call", params, step, key)
        if response.status == 404 and session is not None:
            await self._renew_session(session)
            rid, response = await self._send_request("tools/call", params, step, key)
        result = self._result_of(response, rid, step)
        return ToolResult(tool_call_id=call_id, content=self._tool_text(result, step))

    def _tool_text(self, result: dict[str, Any], step: str) -> str:
        content = result.get("content")
        if not isinstance(content, list):
            raise self._failed(step, "malformed response (the result has no content list)")
        return redact(
            "\n".join(
                item["text"]
                for item in content
                if isinstance(item, dict) and item.get("type") == "text" and isinstance(item.get("text"), str)
            ),
            self._secrets(),
        )

    # --- session ---------------------------------------------------------

    async def _ensure_session(self) -> None:
        async with self._lock:
            if not self._ready:
                await self._handshake()

    async def _renew_session(self, stale: str) -> None:
        async with self._lock:
            # Concurrent calls may all have hit the 404: renew only once.
            if self.session_id == stale:
                self.session_id = self.protocol_version = None
                self._ready = False
                await self._handshake()

    async def _handshake(self) -> None:
        params = {
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": CLIENT_NAME, "version": CLIENT_VERSION},
        }
        rid, response = await self._send_request("initialize", params, "initialize")
        if response.status in NO_HANDSHAKE_STATUSES:
            self._ready = True  # a stateless server: straight to tools/call
            return
        result = self._result_of(response, rid, "initialize")
        version = result.get("protocolVersion")
        if version not in SUPPORTED_VERSIONS:
            raise self._failed("initialize", "the server offered a protocol version this worker does not speak")
        session = response.headers.get("mcp-session-id")
        if session is not None and not _SESSION_ID.fullmatch(session):
            raise self._failed("initialize", "the server sent an invalid Mcp-Session-Id")
        self.session_id, self.protocol_version = session, version
        note = await self._post({"jsonrpc": "2.0", "method": "notifications/initialized"}, "notifications/initialized")
        if not note.ok:
            raise self._failed("notifications/initialized", self._status_problem(note))
        self._ready = True

    # --- one exchange ----------------------------------------------------

    async def _send_request(
        self, method: str, params: dict[str, Any], step: str, key: str | None = None
    ) -> tuple[int, OutboundResponse]:
        rid = next(self._ids)
        message = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
        return rid, await self._post(message, step, key)

    async def _post(self, message: dict[str, Any], step: str, key: str | None = None) -> OutboundResponse:
        # Every POST carries an Idempotency-Key: a tools/call's is stable across runs of its
        # round; the handshake's is new each time (a resumed record starts a new session).
        headers = {**self._headers(), "Idempotency-Key": key or secrets.token_hex(16)}
        try:
            return await self.outbound.post_json(
                self.url, message, headers=headers, timeout_s=self.timeout_s, accept=ACCEPT, tenant=self.tenant
            )
        except OutboundError as exc:
            # Outbound messages name only the origin, never a header.
            raise self._failed(step, exc.message) from None

    def _headers(self) -> dict[str, str]:
        headers = {}
        if self.authorization:
            headers["Authorization"] = self.authorization
        if self.session_id:
            headers["Mcp-Session-Id"] = self.session_id
        if self.protocol_version:
            headers["MCP-Protocol-Version"] = self.protocol_version
        return headers

    def _result_of(self, response: OutboundResponse, rid: int, step: str) -> dict[str, Any]:
        """The `result` of the JSON-RPC response to request `rid`, or a failure."""
        if not response.ok:
            raise self._failed(step, self._status_problem(response))
        try:
            answer = find_response(response, rid)
        except MalformedResponse as exc:
            raise self._failed(step, f"malformed response ({exc})") from None
        if "error" in answer:
            raise self._failed(step, _rpc_error_text(answer["error"], self._secrets()))
        result = answer.get("result")
        if not isinstance(result, dict):
            raise self._failed(step, "malformed response (the result is not an object)")
        return result

    def _status_problem(self, response: OutboundResponse) -> str:
        problem = f"HTTP {response.status}"
        # Servers often explain a 4xx in a JSON-RPC error body
        # (e.g. "Bad Request: Missing session ID"); pass that on.
        try:
            body = orjson.loads(response.body)
        except orjson.JSONDecodeError:
            return problem
        if isinstance(body, dict) and "error" in body and isinstance(body["error"], dict):
            return f"{problem} ({_rpc_error_text(body['error'], self._secrets())})"
        return problem

    def _failed(self, step: str, problem: str) -> ToolExecutionFailed:
        return ToolExecutionFailed(redact(f"MCP {step} failed: {problem}", self._secrets()))

    def _secrets(self) -> tuple[str, ...]:
        return secrets_of(self.authorization, self.session_id)


def _quote(name: str) -> str:
    return "'" + (name if len(name) <= 64 else name[:61] + "...") + "'"


def _rpc_error_text(error: Any, secrets: tuple[str, ...]) -> str:
    if not isinstance(error, dict):
        return "JSON-RPC error (malformed error object)"
    code = error.get("code")
    message = error.get("message")
    text = f"JSON-RPC error {code}" if isinstance(code, int) and not isinstance(code, bool) else "JSON-RPC error"
    if isinstance(message, str) and message:
        text += f": {redact(message, secrets, MAX_SERVER_TEXT)}"
    return text


# --- reading responses -----------------------------------------------------


class MalformedResponse(Exception):
    """The body is not what Streamable HTTP promises; the text says why."""


def find_response(response: OutboundResponse, rid: int) -> dict[str, Any]:
    """The JSON-RPC response (result or error) to request ``rid`` in a 2xx body.

    ``application/json`` carries one message; ``text/event-stream`` carries
    one message per event, and notifications (progress, logs) or server
    requests may come before the response, which is the last thing the
    server writes. The first response with our id is taken; an error with
    id null counts too (the server could not read our id).
    """
    ctype = response.headers.get("content-type", "").split(";")[0].strip().lower()
    messages: Iterable[Any]
    if ctype == "application/json":
        messages = [_json(response.body, "the body is not valid JSON")]
    elif ctype == "text/event-stream":
        messages = (
            _json(event.data.encode(), "an event's data is not valid JSON")
            for event in parse_sse(response.body)
            if event.event == "message" and event.data
        )
    else:
        raise MalformedResponse("the Content-Type is neither application/json nor text/event-stream")
    for message in messages:
        if _answers(message, rid):
            return message
    if ctype == "application/json":
        raise MalformedResponse("the body is not a JSON-RPC response to the request")
    raise MalformedResponse("the event stream ended without a response to the request")


def _json(data: bytes, problem: str) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        raise MalformedResponse(problem) from None


def _answers(message: Any, rid: int) -> TypeGuard[dict[str, Any]]:
    if not isinstance(message, dict) or "method" in message:
        return False
    if "result" in message:
        return message.get("id") == rid
    if "error" in message:
        return message.get("id") in (rid, None)
    return False


# --- server-sent events ----------------------------------------------------


@dataclass(frozen=True)
class SseEvent:
    event: str = "message"
    data: str = ""
    id: str = ""  # the last event id at dispatch, as EventSource keeps it
    retry: int | None = None  # the last reconnection time given, in ms


_EOL = re.compile(r"\r\n|\r|\n")


class SseParser:
    """An incremental text/event-stream parser (the WHATWG EventSource rules).

    Lines end with CRLF, LF or CR (a CRLF split across two chunks counts
    once); a blank line dispatches the event; ``data:`` lines are joined
    with "\\n"; one space after the colon is dropped; lines starting with
    ":" are comments; unknown fields are ignored; ``id`` containing NUL and
    non-numeric ``retry`` are ignored; an event whose data buffer is empty
    is not dispatched. UTF-8 is decoded incrementally (invalid bytes become
    U+FFFD) and a leading BOM is dropped. One deliberate leniency: at the end
    of the body, an event still being built is dispatched rather than lost,
    for servers that omit the final blank line.
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buffer = ""
        self._started = False
        self._event = ""
        self._data: list[str] = []
        self._last_id = ""
        self._retry: int | None = None

    def feed(self, chunk: bytes) -> list[SseEvent]:
        return self._take(self._decoder.decode(chunk), final=False)

    def finish(self) -> list[SseEvent]:
        events = self._take(self._decoder.decode(b"", final=True), final=True)
        if self._buffer:
            self._line(self._buffer, events)
            self._buffer = ""
        if self._data:
            self._dispatch(events)
        return events

    def _take(self, text: str, *, final: bool) -> list[SseEvent]:
        if not self._started and text:
            self._started = True
            text = text.removeprefix("\ufeff")
        buffer = self._buffer + text
        events: list[SseEvent] = []
        pos = 0
        for match in _EOL.finditer(buffer):
            if match.group() == "\r" and match.end() == len(buffer) and not final:
                break  # maybe the first half of a CRLF: wait for the next chunk
            self._line(buffer[pos : match.start()], events)
            pos = match.end()
        self._buffer = buffer[pos:]
        return events

    def _line(self, line: str, events: list[SseEvent]) -> None:
        if not line:
            self._dispatch(events)
            return
        if line.startswith(":"):
            return
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id":
            if "\x00" not in value:
                self._last_id = value
        elif name == "retry":
            if value.isascii() and value.isdigit():
                self._retry = int(value)

    def _dispatch(self, events: list[SseEvent]) -> None:
        if self._data:
            events.append(SseEvent(self._event or "message", "\n".join(self._data), self._last_id, self._retry))
        self._event = ""
        self._data = []


def parse_sse(body: bytes) -> list[SseEvent]:
    """Every event of a complete text/event-stream body."""
    parser = SseParser()
    return parser.feed(body) + parser.finish()
