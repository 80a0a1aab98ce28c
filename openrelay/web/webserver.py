"""The web server's cap on request heads: OPENRELAY_MAX_HEADER_BYTES (64 KB) in all, else 431.

A request head (request line and header lines) is held in memory before the
application sees any of it, so the cap has to be kept by the server's
parser: httptools (llhttp) has no limit at all (an 8 MB header was answered
200), and h11's buffer limit (16 KB by default) answers 400 and only while
the head is incomplete. `manage.py up` and the production notes run uvicorn
with the protocols here (`--http openrelay.web.webserver:HttpToolsProtocol`, or
`:H11Protocol`): past the cap they answer 431 and close, having held at most
the cap and one read (256 KB) of it. HeaderCap, around the ASGI application,
answers the same 431 under any server (daphne; uvicorn started without
these protocols), once that server has read the head.

A head must also arrive in time: OPENRELAY_HEADER_TIMEOUT_S (10 s) after a
connection opens, or after a request's first byte on a kept-alive one, a head
still incomplete gets a 408 and the connection closed. uvicorn has no such
deadline (only keep-alive's, between requests): 2,000 connections that each
sent half a head were all held, for as long as their senders liked.

`head_bytes` is the one measure: the request line, the "name: value"
lines, each with its CRLF, and the blank line that ends the head.
"""

import h11
import orjson
from django.conf import settings
from uvicorn.protocols.http.h11_impl import H11Protocol as _H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _HttpToolsProtocol

_FRAMING = len(b"  HTTP/1.1\r\n") + len(b"\r\n")  # the request line's, and the blank line's


def head_bytes(method, target, headers):
    """The size of a request head as sent: `headers` are (name, value) byte pairs."""
    return len(method) + len(target) + _FRAMING + sum(len(n) + len(v) + 4 for n, v in headers)


def _cap():
    return settings.OPENRELAY_MAX_HEADER_BYTES


def _body(message=None, code="request_headers_too_large"):
    message = message or f"The request's headers are larger than {_cap()} bytes in all; send fewer or shorter ones."
    return orjson.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}})


def _raw(status_line, body):
    return b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s" % (
        status_line,
        len(body),
        body,
    )


def _raw_431():
    return _raw(b"431 Request Header Fields Too Large", _body())


def _raw_408():
    timeout = settings.OPENRELAY_HEADER_TIMEOUT_S
    message = f"The request's head (request line and headers) did not arrive within {timeout:g} seconds."
    return _raw(b"408 Request Timeout", _body(message, "request_head_timeout"))


class _HeadDeadline:
    """Mixed into both protocols: 408 and close when a head is not complete in time (see above).
    `_head_pending()` says whether the connection is waiting for the rest of a head."""

    _head_timer = None

    def connection_made(self, transport):
        super().connection_made(transport)
        self._arm_head_deadline()  # a connection that sends nothing is held no longer than one sending slowly

    def connection_lost(self, exc):
        self._disarm_head_deadline()
        super().connection_lost(exc)

    def data_received(self, data):
        super().data_received(data)
        if self._head_pending():
            self._arm_head_deadline()
        else:
            self._disarm_head_deadline()

    def _arm_head_deadline(self):
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(settings.OPENRELAY_HEADER_TIMEOUT_S, self._head_too_slow)

    def _disarm_head_deadline(self):
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_slow(self):
        self._head_timer = None
        if self._head_pending() and not self.transport.is_closing():
            self.transport.write(_raw_408())
            self.transport.close()


class _HeadTooLarge(Exception):
    """Raised in a parser callback: the parser stops, the server's error path answers (431 here)."""


class HttpToolsProtocol(_HeadDeadline, _HttpToolsProtocol):
    """uvicorn's httptools protocol, counting each head's bytes as they arrive."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._cap = _cap()
        self._in_head = False
        self._began = False
        self._head_bytes = 0
        self._too_large = False
        self._fresh = True  # no byte of a request yet

    def _head_pending(self):
        return self._in_head or self._fresh

    def data_received(self, data):
        self._fresh = False
        self._began = False
        super().data_received(data)
        # Counted when the whole read belongs to one head; the read a head begins in is
        # counted exactly when the head completes (on_headers_complete).
        if self._in_head and not self._began and not self._too_large:
            self._head_bytes += len(data)
            if self._head_bytes > self._cap:
                self._refuse()

    def on_message_begin(self):
        self._in_head, self._began, self._head_bytes = True, True, 0
        super().on_message_begin()

    def on_headers_complete(self):
        self._in_head = False
        if head_bytes(self.parser.get_method(), self.url, self.headers) > self._cap:
            self._too_large = True
            raise _HeadTooLarge
        super().on_headers_complete()

    def send_400_response(self, msg):
        if self._too_large:
            self._refuse()
        else:
            super().send_400_response(msg)

    def _refuse(self):
        self._too_large = True
        if not self.transport.is_closing():
            self.transport.write(_raw_431())
            self.transport.close()


class _CappedConnection(h11.Connection):
    """h11's connection, refusing a complete head over the cap too (its own limit binds only
    while a head is incomplete)."""

    def __init__(self, role, cap):
        super().__init__(role, max_incomplete_event_size=cap)
        self.cap = cap
        self.too_large = False

    def next_event(self):
        try:
            event = super().next_event()
        except h11.RemoteProtocolError as exc:
            self.too_large = exc.error_status_hint == 431
            raise
        if isinstance(event, h11.Request) and head_bytes(event.method, event.target, event.headers) > self.cap:
            self.too_large = True
            raise h11.RemoteProtocolError("request head too large", error_status_hint=431)
        return event


class H11Protocol(_HeadDeadline, _H11Protocol):
    """uvicorn's h11 protocol with the same cap, deadline and answers."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.conn = _CappedConnection(h11.SERVER, _cap())

    def _head_pending(self):
        return self.conn.their_state is h11.IDLE

    def send_400_response(self, msg):
        if not self.conn.too_large:
            super().send_400_response(msg)
        elif not self.transport.is_closing():
            self.transport.write(_raw_431())
            self.transport.close()


class HeaderCap:
    """ASGI middleware: the same 431 for a head over the cap, whichever server read it."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] in ("http", "websocket") and self._over(scope):
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1009})
                return
            body = _body()
            await send(
                {
                    "type": "http.response.start",
                    "status": 431,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)

    @staticmethod
    def _over(scope):
        target = scope.get("raw_path") or scope["path"].encode()
        if scope.get("query_string"):
            target += b"?" + scope["query_string"]
        return head_bytes(scope.get("method", "GET").encode(), target, scope["headers"]) > _cap()
