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
executors, MCP servers, workflow callbacks) go through openrelay.outbound,
which guards their addresses.
"""

import asyncio
import ssl
import zlib
from dataclasses import dataclass
from urllib.parse import urlsplit

import httptools

from openrelay.outbound import valid_header

# Idle connections older than this are closed instead of reused: uvicorn
# (vLLM's server) drops idle keep-alive connections after 5 s, and a request
# written into a connection the server is closing fails for nothing.
KEEPALIVE_S = 4.0
DEFAULT_PORTS = {"http": 80, "https": 443}


class TransportError(Exception):
    """The model server could not be talked to (the caller treats it as a failed server)."""


class ServerDisconnected(TransportError):
    """The connection closed before a whole answer arrived."""


class BadResponse(TransportError):
    """What arrived is not an HTTP/1.1 answer this transport can read."""


@dataclass
class Response:
    status: int
    headers: dict  # lower-cased name -> value; a repeated header keeps its last value
    body: bytes


class Origin:
    """Keep-alive connections to one model server (scheme, host, port) and POSTs over them.

    The caller bounds concurrency (a deployment's semaphore), so the pool
    keeps every idle connection and opens one whenever none is idle.
    """

    def __init__(self, base_url, *, connect_timeout_s, ssl_context=None):
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
        self._idle = []  # _Connection, most recently used last

    def prepare(self, path, headers, method="POST"):
        """The request head up to the body's length, for `method` (POST; GET for health probes)
        to `path` (below the base URL's path)."""
        lines = [f"{method} {self.prefix}{path} HTTP/1.1", f"Host: {self.authority}"]
        for name, value in headers.items():
            if not valid_header(name, value):
                raise ValueError(f"header {name!r} has a character HTTP forbids")
            lines.append(f"{name}: {value}")
        lines.append("Content-Length: ")
        return "\r\n".join(lines).encode("latin-1")

    async def post(self, head, body):
        """Send a prepared head and `body` (b"" for a GET); return the Response. Raises TransportError or OSError."""
        connection = self._take_idle() or await self._connect()
        try:
            response = await connection.exchange(b"".join((head, str(len(body)).encode(), b"\r\n\r\n", body)))
        except BaseException:
            # Failed, or cancelled mid-answer (the call limit): the connection's state is unknown.
            connection.abort()
            raise
        if connection.reusable:
            connection.idle_since = asyncio.get_running_loop().time()
            self._idle.append(connection)
        else:
            connection.abort()
        return response

    def _take_idle(self):
        now = asyncio.get_running_loop().time()
        while self._idle:
            connection = self._idle.pop()
            if connection.open and now - connection.idle_since < KEEPALIVE_S:
                return connection
            connection.abort()
        return None

    async def _connect(self):
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.connect_timeout_s):
            _, connection = await loop.create_connection(
                _Connection, self.host, self.port, ssl=self.ssl, server_hostname=self.host if self.ssl else None
            )
        return connection

    def close(self):
        while self._idle:
            self._idle.pop().abort()


class _Connection(asyncio.Protocol):
    """One connection; one exchange at a time. httptools calls the on_* methods while parsing."""

    def __init__(self):
        self.transport = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter = None
        self.closed = False
        self.reusable = False
        self.idle_since = 0.0
        self._reset()

    def _reset(self):
        self.headers = {}
        self.body = []
        self.headers_done = False

    @property
    def open(self):
        # is_closing: the server's close arrived and connection_lost is about to run.
        return not self.closed and not self.transport.is_closing()

    # asyncio.Protocol

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        if self.waiter is None or self.waiter.done():
            # Nothing asked: a server that talks out of turn can't be trusted with the next request.
            self.abort()
            return
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self._fail(BadResponse(f"the model server's answer is not valid HTTP/1.1 ({exc})"))
            self.abort()

    def connection_lost(self, exc):
        self.closed = True
        if self.waiter is None or self.waiter.done():
            return
        if self.headers_done and "content-length" not in self.headers and "transfer-encoding" not in self.headers:
            # No length and not chunked: the body ran until the server closed (HTTP/1.0 style).
            self._finish(keep_alive=False)
        else:
            self._fail(ServerDisconnected("the model server closed the connection before it answered"))

    # httptools callbacks

    def on_header(self, name, value):
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self):
        self.headers_done = True

    def on_body(self, body):
        self.body.append(body)

    def on_message_complete(self):
        if self.parser.get_status_code() < 200:
            self._reset()  # an interim 1xx answer: the real one follows
            return
        self._finish(keep_alive=self.parser.should_keep_alive())

    # the exchange

    async def exchange(self, request):
        if not self.open:
            raise ServerDisconnected("the connection to the model server closed")
        self.waiter = asyncio.get_running_loop().create_future()
        self.reusable = False
        self._reset()
        self.transport.write(request)
        return await self.waiter

    def _finish(self, keep_alive):
        body = b"".join(self.body)
        encoding = self.headers.get("content-encoding", "identity").strip().lower()
        if encoding in ("gzip", "x-gzip", "deflate"):
            try:
                # wbits 47: gzip or zlib by the header; a raw deflate stream needs -15.
                body = zlib.decompress(body, 47) if encoding != "deflate" else _inflate(body)
            except zlib.error as exc:
                self._fail(BadResponse(f"the model server's {encoding} body does not decompress ({exc})"))
                return
        elif encoding != "identity":
            self._fail(BadResponse(f"the model server answered in an encoding this worker can't read ({encoding})"))
            return
        self.reusable = keep_alive and not self.closed
        self.waiter.set_result(Response(self.parser.get_status_code(), self.headers, body))

    def _fail(self, exc):
        self.reusable = False
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)

    def abort(self):
        self.closed = True
        self.reusable = False
        if self.transport is not None:
            self.transport.abort()


def _inflate(body):
    try:
        return zlib.decompress(body)  # "deflate" as the RFC means it: a zlib stream
    except zlib.error:
        return zlib.decompress(body, -15)  # as many servers send it: raw deflate
