"""Django's ASGI handler with a bound on the requests inside Django at once,
and request bodies read whatever their framing, counted and capped as they arrive.

Under ASGI every request runs its sync code (middleware, views) in a thread
of its own, and each such thread opens its own database connection. With
nothing in between, 100 clients polling at once meant 100 connections from
one web process: PostgreSQL's default max_connections is 100, so requests
failed with "too many clients" (tests/perf/load_polling.py found it).

This handler lets at most OPENRELAY_WEB_CONCURRENCY requests run the view
stack at once; the rest wait their turn (a queue, not an error). The bound
covers only the view: request bodies are read and responses are sent
(uploads and downloads stream) outside it, and each request's connection is
closed as the view returns, so a slow client never holds a slot or a
connection.

Bodies. Django reads the whole body into a spooled temporary file before the
view runs, and its parsers (and DRF's) trust CONTENT_LENGTH, which a chunked
body (`Transfer-Encoding: chunked`: the Node SDK's uploads, any streaming
client) does not have. So read_body counts the bytes as they arrive and
CONTENT_LENGTH is set to that count, for either framing. Past the body cap
of its kind (an upload's for multipart/form-data, a JSON body's for anything
else) the bytes are read and dropped, never stored, so the client still gets
its answer; the view sees a CONTENT_LENGTH over its limit and answers 413.
"""

import asyncio
import tempfile

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler
from django.db import close_old_connections

from openrelay.web import dialects

# Multipart framing and the small text fields (purpose, expires_after) that
# ride along with an uploaded file: a multipart body longer than the upload
# limit + this can't hold an acceptable file.
MULTIPART_OVERHEAD_BYTES = 64 * 1024


def body_cap(content_type, path=""):
    """The most body bytes kept for a request of this Content-Type (to this path)."""
    if content_type.lower().startswith("multipart/form-data"):
        return settings.OPENRELAY_MAX_UPLOAD_BYTES + MULTIPART_OVERHEAD_BYTES
    setting = dialects.body_cap_setting(path)  # Anthropic's Message Batch create: its requests inline
    if setting is not None:
        return max(getattr(settings, setting), settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
    return settings.DATA_UPLOAD_MAX_MEMORY_SIZE


class _Receive:
    """One request's ASGI receive, carrying its body cap to read_body (which gets only receive)."""

    def __init__(self, receive, scope):
        self.receive = receive
        content_type = next((value for name, value in scope.get("headers", ()) if name == b"content-type"), b"")
        self.cap = body_cap(content_type.decode("latin-1"), scope.get("path", ""))

    def __call__(self):
        return self.receive()


class BoundedASGIHandler(ASGIHandler):
    def __init__(self, limit):
        super().__init__()
        self.limit = limit
        self._slots = None  # made in the server's event loop, on the first request

    async def handle(self, scope, receive, send):
        await super().handle(scope, _Receive(receive, scope), send)

    async def read_body(self, receive):
        """Django's read_body, counting: what passes receive.cap is read and dropped, and so is what came before."""
        # In the upload temp dir (the data disk), not /tmp, which may be memory.
        body = tempfile.SpooledTemporaryFile(
            max_size=settings.FILE_UPLOAD_MAX_MEMORY_SIZE, mode="w+b", dir=settings.FILE_UPLOAD_TEMP_DIR
        )
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                body.close()
                raise RequestAborted()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size <= receive.cap:
                body.write(chunk)
            elif size - len(chunk) <= receive.cap:  # the chunk that crossed the cap
                body.seek(0)
                body.truncate()
            if not message.get("more_body", False):
                break
        body.seek(0)
        body.received = size
        return body

    def create_request(self, scope, body_file):
        request, error_response = super().create_request(scope, body_file)
        if request is not None:
            request.META["CONTENT_LENGTH"] = str(body_file.received)
        return request, error_response

    async def run_get_response(self, request):
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.limit)
        async with self._slots:
            try:
                return await super().run_get_response(request)
            finally:
                # In this request's thread: give its connection back before the slot.
                await sync_to_async(close_old_connections)()
