"""Django's ASGI handler with a bound on the requests inside Django at once.

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
"""

import asyncio

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler
from django.db import close_old_connections


class BoundedASGIHandler(ASGIHandler):
    def __init__(self, limit):
        super().__init__()
        self.limit = limit
        self._slots = None  # made in the server's event loop, on the first request

    async def run_get_response(self, request):
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.limit)
        async with self._slots:
            try:
                return await super().run_get_response(request)
            finally:
                # In this request's thread: give its connection back before the slot.
                await sync_to_async(close_old_connections)()
