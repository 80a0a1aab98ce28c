"""HTTP/1.1 to model servers: the engine's hot path, kept lean.

Every record costs at least one POST to a model server, so the CPU of one
POST bounds a worker's record rate. aiohttp's client spent 120-180 µs of CPU
on one here (request and response objects, a writer task per request,
header multidicts); this transport writes one prepared request head plus the
body and parses the answer with httptools (llhttp, the parser uvicorn runs):
55-60 µs (`manage.py bench` measures the engine against a bare aiohttp
client). It speaks only what model calls need: POST, keep-alive
connections, Content-Length, chunked or close-delimited answers, gzip or
deflate bodies, TLS.

Model servers are the operator's deployments. User-supplied URLs (tool
executors, MCP servers, workflow callbacks) go through openrelay.lib.outbound,
which guards their addresses.

A broken or hostile server (or a proxy in front of it) must not exhaust a
worker: an answer is capped at `max_answer_bytes` on the wire and again as
it is inflated (gzip/deflate are inflated chunk by chunk as they arrive, so
a bomb never grows past the cap), and a server that goes silent once its
answer has begun is cut by `Origin.cut_idle` (the caller's watchdog calls
it; a timer per call would cost more than the rest of the checks). Both
fail the exchange with a TransportError, which the caller counts as a
failed server. The caps cost two additions and a comparison per chunk.

The engine's byte budget for answers it holds (batches.engine.calls.budget)
is taken here, when an answer's head announces its length: a big answer that
would pass it stops the connection reading until there is room.

The standard proxy variables are honoured, as Python's urllib reads them:
HTTP_PROXY for http:// servers (requests in absolute form), HTTPS_PROXY for
https:// ones (a CONNECT tunnel, then TLS to the server through it), both
skipped for hosts NO_PROXY names. Proxies are http:// URLs, optionally with
user:password (sent as Basic Proxy-Authorization).
"""

from __future__ import annotations

import asyncio
import base64
import ssl
import urllib.request
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NoReturn, cast
from urllib.parse import unquote, urlsplit

import httptools

from batches.engine.calls import budget
from batches.engine.calls.inflate import Inflater
from openrelay.lib.outbound import valid_header

# Idle connections older than this are closed instead of reused: uvicorn
# (vLLM's server) drops idle keep-alive connections after 5 s, and a request
# written into a connection the server is closing fails for nothing.
KEEPALIVE_S = 4.0
DEFAULT_PORTS = {"http": 80, "https": 443}
# 2,048 embeddings of 3,072 dimensions (an embeddings request as large as
# OpenAI's API takes, of its largest model) written as JSON floats the way
# vLLM or OpenAI write them: ~137 MB. The default fits that and little more.
DEFAULT_MAX_ANSWER_BYTES = 144 * 1024 * 1024
# The most a proxy's answer to CONNECT may take before its blank line.
MAX_TUNNEL_HEAD_BYTES = 64 * 1024


class TransportError(Exception):
    """The model server could not be talked to (the caller treats it as a failed server)."""


class ServerDisconnected(TransportError):
    """The connection closed before a whole answer arrived."""


class BadResponse(TransportError):
    """What arrived is not an HTTP/1.1 answer this transport can read."""


class AnswerTooLarge(TransportError):
    """The answer passed the cap, on the wire or inflated."""


class IdleTimeout(TransportError):
    """The server went silent in the middle of its answer."""


class ProxyRefused(TransportError):
    """The proxy would not open a tunnel to the model server."""


@dataclass
class Response:
    status: int
    headers: dict[str, str]  # lower-cased name -> value; a repeated header keeps its last value
    body: bytes | bytearray  # a bytearray when read in pieces: joined as it came, never copied whole


@dataclass(frozen=True)
class Proxy:
    host: str
    port: int
    authorization: str | None  # the Proxy-Authorization value, from user:password in the proxy URL

    @classmethod
    def parse(cls, url: str) -> Proxy:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"a proxy URL must be http://[user:password@]host[:port], not {parts.scheme}://...")
        authorization = None
        if parts.username is not None:
            pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            authorization = "Basic " + base64.b64encode(pair).decode()
        return cls(parts.hostname, parts.port or 80, authorization)


def proxy_for(scheme: str, host: str) -> Proxy | None:
    """The Proxy the environment names for `scheme` (http/https) and `host`, or None: direct."""
    proxies = urllib.request.getproxies_environment()
    url = proxies.get(scheme)
    # typeshed leaves out proxy_bypass_environment (urllib.request has it since Python 3.0, undocumented).
    if not url or urllib.request.proxy_bypass_environment(host, proxies):  # type: ignore[attr-defined]
        return None
    return Proxy.parse(url)


class Origin:
    """Keep-alive connections to one model server (scheme, host, port) and POSTs over them.

    The caller bounds concurrency (a deployment's semaphore), so the pool
    keeps every idle connection and opens one whenever none is idle.
    """

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout_s: float,
        ssl_context: ssl.SSLContext | None = None,
        max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
    ) -> None:
        """Raises ValueError for a URL (or a proxy in the environment) this transport can't use."""
        parts = urlsplit(base_url)
        if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
            raise ValueError(f"a model server URL must be http(s)://host[:port][/path], not {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or DEFAULT_PORTS[parts.scheme]
        self.ssl = (ssl_context or ssl.create_default_context()) if parts.scheme == "https" else None
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.authority = host if self.port == DEFAULT_PORTS[parts.scheme] else f"{host}:{self.port}"
        self.prefix = parts.path.rstrip("/")
        self.connect_timeout_s = connect_timeout_s
        self.max_answer_bytes = max_answer_bytes
        self.proxy = proxy_for(parts.scheme, self.host)
        # Through a proxy, an http:// request names the whole URL; an https:// one goes in a tunnel as it is.
        self._target = f"http://{self.authority}{self.prefix}" if self.proxy and not self.ssl else self.prefix
        self._idle: list[_Connection] = []  # most recently used last
        self._busy: set[_Connection] = set()  # in an exchange

    def prepare(self, path: str, headers: Mapping[str, str], method: str = "POST", root: bool = False) -> bytes:
        """The request head up to the body's length, for `method` (POST; GET for health probes)
        to `path` (below the base URL's path; `root`: below the server's root, as /metrics is)."""
        target = self._target.removesuffix(self.prefix) if root and self.prefix else self._target
        lines = [f"{method} {target}{path} HTTP/1.1", f"Host: {self.authority}"]
        if self.proxy and not self.ssl and self.proxy.authorization:
            lines.append(f"Proxy-Authorization: {self.proxy.authorization}")
        for name, value in headers.items():
            if not valid_header(name, value):
                raise ValueError(f"header {name!r} has a character HTTP forbids")
            lines.append(f"{name}: {value}")
        lines.append("Content-Length: ")
        return "\r\n".join(lines).encode("latin-1")

    async def post(self, head: bytes, body: bytes, ready: Callable[[], None] | None = None) -> Response:
        """Send a prepared head and `body` (b"" for a GET); return the Response. Raises TransportError or OSError.

        `ready` runs once a connection is at hand, right before the request is written (nothing waits in
        between): it raises to keep the request unsent, and the connection, unused, stays idle."""
        connection = self._take_idle() or await self._connect()
        if ready is not None:
            try:
                ready()
            except BaseException:
                connection.idle_since = asyncio.get_running_loop().time()
                self._idle.append(connection)
                raise
        self._busy.add(connection)
        try:
            response = await connection.exchange(b"".join((head, str(len(body)).encode(), b"\r\n\r\n", body)))
        except BaseException:
            # Failed, or cancelled mid-answer (the call limit): the connection's state is unknown.
            connection.abort()
            raise
        finally:
            self._busy.discard(connection)
        if connection.reusable:
            connection.idle_since = asyncio.get_running_loop().time()
            self._idle.append(connection)
        else:
            connection.abort()
        return response

    def _take_idle(self) -> _Connection | None:
        now = asyncio.get_running_loop().time()
        while self._idle:
            connection = self._idle.pop()
            if connection.open and now - connection.idle_since < KEEPALIVE_S:
                return connection
            connection.abort()
        return None

    def cut_idle(self, now: float, idle_s: float) -> None:
        """Fail every exchange whose answer began but sent nothing for more than `idle_s` (loop time `now`).

        Before the first byte the server may be working (a non-streamed answer starts when the
        model is done): the call's time limit covers that.
        """
        for connection in list(self._busy):
            if connection.read_at and now - connection.read_at > idle_s:
                connection.cut(
                    IdleTimeout(f"the model server sent nothing for {idle_s:g} s in the middle of its answer")
                )

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        make: Callable[[], _Connection] = lambda: _Connection(self.max_answer_bytes)  # noqa: E731
        proxy, ssl_context = self.proxy, self.ssl
        async with asyncio.timeout(self.connect_timeout_s):
            if proxy is None:
                _, connection = await loop.create_connection(
                    make, self.host, self.port, ssl=ssl_context, server_hostname=self.host if ssl_context else None
                )
            elif ssl_context is None:
                _, connection = await loop.create_connection(make, proxy.host, proxy.port)
            else:
                connection = await self._tunnel(loop, make(), proxy, ssl_context)
        return connection

    async def _tunnel(
        self, loop: asyncio.AbstractEventLoop, connection: _Connection, proxy: Proxy, ssl_context: ssl.SSLContext
    ) -> _Connection:
        """CONNECT through the proxy, then TLS to the model server inside the tunnel."""
        transport, tunnel = await loop.create_connection(_Tunnel, proxy.host, proxy.port)
        try:
            await tunnel.open(self.authority, proxy.authorization)
            tls = await loop.start_tls(transport, connection, ssl_context, server_hostname=self.host)
            if tls is None:
                # start_tls hands back None when the connection was lost between the end of the
                # handshake and its return (asyncio's SSLProtocol drops its transport on connection_lost).
                raise ServerDisconnected("the model server closed the connection after the TLS handshake")
        except BaseException:
            transport.abort()
            raise
        connection.connection_made(tls)
        return connection

    def close(self) -> None:
        while self._idle:
            self._idle.pop().abort()


class _Tunnel(asyncio.Protocol):
    """A connection to a proxy until it answers CONNECT; then TLS takes the transport over."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.head = bytearray()
        self.answered: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # create_connection hands its protocol a Transport; asyncio.Protocol's signature names the base class.
        self.transport = cast(asyncio.Transport, transport)

    async def open(self, authority: str, authorization: str | None) -> None:
        request = f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n"
        if authorization:
            request += f"Proxy-Authorization: {authorization}\r\n"
        assert self.transport is not None  # create_connection returns after connection_made
        self.transport.write((request + "\r\n").encode("latin-1"))
        head = await self.answered
        status_line = head.split(b"\r\n", 1)[0].split(b" ", 2)
        if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/1.") or not status_line[1].startswith(b"2"):
            raise ProxyRefused(f"the proxy refused a tunnel to the model server ({bytes(head[:40])!r})")

    def data_received(self, data: bytes) -> None:
        if self.answered.done():
            return
        self.head += data
        end = self.head.find(b"\r\n\r\n")
        if end != -1:
            # A proxy says nothing more until the client speaks TLS.
            self.answered.set_result(bytes(self.head[:end]))
        elif len(self.head) > MAX_TUNNEL_HEAD_BYTES:
            self.answered.set_exception(BadResponse("the proxy's answer to CONNECT is too long"))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.answered.done():
            self.answered.set_exception(ServerDisconnected("the proxy closed the connection before it answered"))


class _Connection(asyncio.Protocol):
    """One connection; one exchange at a time. httptools calls the on_* methods while parsing."""

    def __init__(self, max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.max_bytes = max_answer_bytes
        self.waiter: asyncio.Future[Response] | None = None
        self.closed = False
        self.reusable = False
        self.idle_since = 0.0
        self.holding: budget.Holding | None = None  # the record's, for the exchange in flight
        self.reserved = 0  # budget bytes taken for the answer in flight
        self.waiting_room: Callable[[], None] | None = None  # a queued budget take (reading paused)
        self.on_wait: Callable[[], None] | None = None  # the call's, told when its answer waits (budget.waits)
        self._reset()

    def _reset(self) -> None:
        self.headers: dict[str, str] = {}
        self.body = bytearray()
        self.wire_bytes = 0
        self.inflater: Inflater | None = None
        self.headers_done = False
        self.read_at = 0.0  # loop time of the last bytes of the answer in flight; 0: none yet

    @property
    def open(self) -> bool:
        # is_closing: the server's close arrived and connection_lost is about to run. (The pool only
        # asks connections that are made, so the transport is there.)
        assert self.transport is not None
        return not self.closed and not self.transport.is_closing()

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # create_connection and start_tls hand a Transport; asyncio.Protocol's signature names the base class.
        self.transport = cast(asyncio.Transport, transport)
        self.clock = asyncio.get_running_loop().time

    def data_received(self, data: bytes) -> None:
        if self.waiter is None or self.waiter.done():
            # Nothing asked: a server that talks out of turn can't be trusted with the next request.
            self.abort()
            return
        self.read_at = self.clock()
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            # A callback that failed the exchange (a cap) stops the parser this way too; _fail keeps that reason.
            self._fail(BadResponse(f"the model server's answer is not valid HTTP/1.1 ({exc})"))
            self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is None or self.waiter.done():
            return
        if self.headers_done and "content-length" not in self.headers and "transfer-encoding" not in self.headers:
            # No length and not chunked: the body ran until the server closed (HTTP/1.0 style).
            self._finish(keep_alive=False)
        else:
            self._fail(ServerDisconnected("the model server closed the connection before it answered"))

    # httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.headers_done = True
        length = self.headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_bytes:
            self._too_large(f"the model server's answer announces {length} bytes, over the {self.max_bytes}-byte cap")
        encoding = self.headers.get("content-encoding", "identity").strip().lower()
        if encoding in ("gzip", "x-gzip", "deflate"):
            self.inflater = Inflater(encoding)
        elif encoding != "identity":
            self._fail(BadResponse(f"the model server answered in an encoding this worker can't read ({encoding})"))
            raise _Stop
        if self.holding is not None and length.isdigit() and int(length) > budget.SMALL_BYTES:
            self._reserve(int(length))

    def _reserve(self, size: int) -> None:
        """Take the answer's bytes from the budget, or stop reading until they are taken."""
        assert self.holding is not None and self.transport is not None

        def granted() -> None:
            self.waiting_room = None
            self.reserved = size
            if not self.closed and self.transport is not None:
                self.read_at = self.clock()
                self.transport.resume_reading()

        self.waiting_room = self.holding.take(size, granted)
        if self.waiting_room is None:
            self.reserved = size
            return
        self.transport.pause_reading()
        self.read_at = 0.0  # waiting for room is not a silent server: cut_idle passes it by
        if self.on_wait is not None:
            self.on_wait()  # answered: the call's slot at the gate goes back now (budget.py)

    def on_body(self, body: bytes) -> None:
        self.wire_bytes += len(body)
        if self.wire_bytes > self.max_bytes:
            self._too_large(f"the model server's answer is longer than the {self.max_bytes}-byte cap")
        if self.inflater is None:
            self.body += body
            return
        try:
            # Stops one byte past the cap: a bomb never grows further.
            self.inflater.inflate_into(body, self.body, self.max_bytes + 1)
        except zlib.error as exc:
            self._fail(BadResponse(f"the model server's {self.inflater.encoding} body does not decompress ({exc})"))
            raise _Stop from None
        if len(self.body) > self.max_bytes:
            self._too_large(
                f"the model server's {self.inflater.encoding} answer inflates to more than the "
                f"{self.max_bytes}-byte cap"
            )

    def _too_large(self, message: str) -> NoReturn:
        self._fail(AnswerTooLarge(message))
        raise _Stop

    def on_message_complete(self) -> None:
        if self.parser.get_status_code() < 200:
            self._reset()  # an interim 1xx answer: the real one follows
            return
        self._finish(keep_alive=self.parser.should_keep_alive())

    # the exchange

    async def exchange(self, request: bytes) -> Response:
        if not self.open:
            raise ServerDisconnected("the connection to the model server closed")
        assert self.transport is not None  # open says so
        waiter: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        self.waiter = waiter
        self.reusable = False
        self._reset()
        self.holding = budget.current.get()
        self.on_wait = budget.waits.get()
        self.transport.write(request)
        return await waiter

    def _finish(self, keep_alive: bool) -> None:
        # Called only with an exchange in flight: data_received and connection_lost check for a waiter first.
        assert self.waiter is not None
        if self.waiter.done():
            return  # failed by a cap while the parser still held the message's last bytes
        if self.inflater is not None and not self.inflater.ended:
            self._fail(
                BadResponse(
                    f"the model server's {self.inflater.encoding} body does not decompress (the stream is cut short)"
                )
            )
            return
        self.reusable = keep_alive and not self.closed
        self.read_at = 0.0
        if self.holding is not None:
            # The record holds the answer now (until its flush): what it took, made exact.
            self.holding.force(len(self.body) - self.reserved)
            self.reserved = 0
        self.waiter.set_result(Response(self.parser.get_status_code(), self.headers, self.body))
        # The answer is the caller's now: an idle connection kept its last one (up to a cap's worth,
        # each) until its next exchange.
        self.body = bytearray()

    def _fail(self, exc: TransportError) -> None:
        self.reusable = False
        self._give_back()
        # The failure (in the waiter) and this connection keep each other until a GC pass: let the
        # body go now, or every failed attempt would hold up to a cap's worth of memory.
        self.body = bytearray()
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)

    def cut(self, exc: TransportError) -> None:
        self._fail(exc)
        self.abort()

    def abort(self) -> None:
        self.closed = True
        self.reusable = False
        self.read_at = 0.0
        self._give_back()
        self.body = bytearray()
        if self.transport is not None:
            self.transport.abort()

    def _give_back(self) -> None:
        """An answer that will not be held: its budget bytes (or its place in line) go back."""
        if self.holding is None:
            return
        if self.waiting_room is not None:
            self.holding.budget.cancel(self.waiting_room)
            self.waiting_room = None
        if self.reserved:
            self.holding.give_back(self.reserved)
            self.reserved = 0


class _Stop(Exception):
    """Raised in a parser callback to stop parsing an answer that already failed."""
