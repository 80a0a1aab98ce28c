"""The web process bounds the requests inside Django at once (openrelay/web/asgi_handler.py):
each holds a database connection, and 100 pollers exhausted PostgreSQL's 100."""

import asyncio

from django.core.handlers.asgi import ASGIHandler
from django.http import HttpResponse

from openrelay import asgi
from openrelay.web.asgi_handler import BoundedASGIHandler


def _scope(path):
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver")],
        "client": ("127.0.0.1", 1234),
        "server": ("testserver", 80),
    }


async def _request(app, path):
    sent = []
    body_sent = False

    async def receive():
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()  # no disconnect

    async def send(message):
        sent.append(message)

    await app(_scope(path), receive, send)
    return next(m["status"] for m in sent if m["type"] == "http.response.start")


def test_at_most_the_limit_run_views_at_once_and_the_rest_wait(monkeypatch):
    running, peak = 0, 0

    async def slow_view(self, request):
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.05)
        running -= 1
        return HttpResponse("ok")

    monkeypatch.setattr(ASGIHandler, "run_get_response", slow_view)
    handler = BoundedASGIHandler(3)

    async def scenario():
        return await asyncio.gather(*(_request(handler, f"/v1/x{i}") for i in range(20)))

    statuses = asyncio.run(scenario())
    assert statuses == [200] * 20  # queued, never refused
    assert peak == 3


def test_the_served_application_is_bounded_by_the_setting():
    from django.conf import settings

    assert isinstance(asgi.django_asgi_app, BoundedASGIHandler)
    assert asgi.django_asgi_app.limit == settings.OPENRELAY_WEB_CONCURRENCY == 32


def test_a_real_request_through_the_bounded_handler_closes_its_connection(db):
    # The API answers through it as before (401 here: no key), and nothing is left open in its thread.
    status = asyncio.run(_request(BoundedASGIHandler(2), "/v1/batches"))
    assert status == 401
