"""The outbound guard against real local servers on 127.0.0.1.

pytest-asyncio is not installed: every async scenario runs in asyncio.run.
Nothing here needs the database.
"""

import asyncio
import gzip
import ipaddress
import os
import re
import socket
import subprocess
import sys
from collections import Counter
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from openrelay.lib.outbound import (
    HOST_REFUSED,
    BlockedURL,
    GuardedResolver,
    OutboundClient,
    OutboundError,
    OutboundResponse,
    check_url,
    is_blocked_address,
    redact_headers,
)
from tests.helpers import free_port

SECRET = "sk-live-very-secret-token"
CAP = 10 * 1024 * 1024
ELEVEN_MB = 11 * 1024 * 1024


# --- local servers ---------------------------------------------------------


class LocalServer:
    def __init__(self, base: str):
        self.base = base
        self.hits: Counter[str] = Counter()
        self.seen_headers: dict[str, CIMultiDict] = {}
        self.release = asyncio.Event()

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return self.base.replace("127.0.0.1", host) + path


def _build_app(server_ref: list) -> web.Application:
    @web.middleware
    async def count(request, handler):
        server = server_ref[0]
        server.hits[request.path] += 1
        server.seen_headers[request.path] = CIMultiDict(request.headers)
        return await handler(request)

    async def echo(request):
        return web.json_response({"got": await request.json()})

    async def redirect(request):
        raise web.HTTPFound("/target")

    async def target(request):
        return web.json_response({"reached": True})

    async def big(request):
        # Chunked: no Content-Length, so only counting while reading stops it.
        response = web.StreamResponse()
        await response.prepare(request)
        block = b"x" * (64 * 1024)
        for _ in range(ELEVEN_MB // len(block)):
            await response.write(block)
        await response.write_eof()
        return response

    async def gzip_bomb(request):
        # ~11 KB on the wire, 11 MB once aiohttp decompresses it.
        body = gzip.compress(b"0" * ELEVEN_MB)
        return web.Response(body=body, headers={"Content-Encoding": "gzip"})

    async def slow(request):
        server = server_ref[0]
        # Waits for teardown rather than a fixed sleep, so cleanup is quick.
        await server.release.wait()
        return web.json_response({})

    async def not_json(request):
        return web.Response(text="<html>oops", content_type="text/html")

    async def end(request):
        return web.Response(status=204) if not await request.read() else web.Response(status=400)

    app = web.Application(middlewares=[count])
    app.router.add_post("/echo", echo)
    app.router.add_post("/redirect", redirect)
    app.router.add_post("/target", target)
    app.router.add_post("/big", big)
    app.router.add_post("/gzip", gzip_bomb)
    app.router.add_post("/slow", slow)
    app.router.add_post("/not-json", not_json)
    app.router.add_delete("/session", end)
    return app


@asynccontextmanager
async def local_server():
    ref: list = []
    runner = web.AppRunner(_build_app(ref), shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    server = LocalServer(f"http://127.0.0.1:{port}")
    ref.append(server)
    try:
        yield server
    finally:
        server.release.set()
        await runner.cleanup()


@asynccontextmanager
async def raw_server(response: bytes, trailing: int = 0):
    """A hand-written HTTP/1.1 peer, for responses aiohttp.web won't send.

    It writes ``response`` and then ``trailing`` more bytes, then closes.
    """
    handlers: set[asyncio.Task] = set()
    writers: list[asyncio.StreamWriter] = []

    async def handle(reader, writer):
        handlers.add(asyncio.current_task())
        writers.append(writer)
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(response)
            block = b"y" * (64 * 1024)
            for _ in range(trailing // len(block)):
                writer.write(block)
                await writer.drain()
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            pass  # the client hung up once it had enough, as it should
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/raw"
    finally:
        server.close()
        # A handler may be stuck in drain() against a client that stopped
        # reading; closing its transport ends it. One already closing is
        # left alone: aborting a transport whose connection_lost has run
        # raises inside asyncio (it has dropped its loop).
        for writer in writers:
            if not writer.transport.is_closing():
                writer.transport.abort()
        if handlers:
            await asyncio.wait(handlers, timeout=2)
        await server.wait_closed()


def run(coro):
    return asyncio.run(coro)


# --- addresses -------------------------------------------------------------

BLOCKED = [
    ("127.0.0.1", "loopback"),
    ("127.255.255.254", "loopback /8"),
    ("::1", "v6 loopback"),
    ("0.0.0.0", "unspecified"),
    ("::", "v6 unspecified"),
    ("0.1.2.3", "this network 0/8"),
    ("10.0.0.1", "rfc1918 10/8"),
    ("172.16.0.1", "rfc1918 172.16/12 low"),
    ("172.31.255.255", "rfc1918 172.16/12 high"),
    ("192.168.1.1", "rfc1918 192.168/16"),
    ("100.64.0.1", "cgnat low"),
    ("100.127.255.255", "cgnat high"),
    ("100.100.100.200", "alibaba metadata"),
    ("169.254.0.1", "link-local"),
    ("169.254.169.254", "aws/gcp/azure metadata"),
    ("fe80::1", "v6 link-local"),
    ("fe80::1%eth0", "v6 link-local with zone id"),
    ("fd00:ec2::254", "aws v6 metadata"),
    ("fc00::1", "unique local fc"),
    ("fd12:3456::1", "unique local fd"),
    ("fec0::1", "deprecated site-local"),
    ("224.0.0.1", "multicast"),
    ("239.255.255.250", "multicast ssdp"),
    ("ff02::1", "v6 multicast link"),
    ("ff0e::1", "v6 multicast global"),
    ("255.255.255.255", "broadcast"),
    ("240.0.0.1", "reserved 240/4"),
    ("198.18.0.1", "benchmark low"),
    ("198.19.255.255", "benchmark high"),
    ("192.0.2.1", "documentation 1"),
    ("198.51.100.1", "documentation 2"),
    ("203.0.113.1", "documentation 3"),
    ("2001:db8::1", "v6 documentation"),
    ("3fff::1", "v6 documentation rfc9637"),
    ("192.0.0.170", "ietf protocol assignments"),
    ("::ffff:127.0.0.1", "mapped loopback"),
    ("::ffff:169.254.169.254", "mapped metadata"),
    ("::ffff:10.0.0.1", "mapped private"),
    ("64:ff9b::7f00:1", "nat64 of loopback"),
    ("64:ff9b::169.254.169.254", "nat64 of metadata"),
    ("64:ff9b:1::a00:1", "local-use nat64"),
    ("2002:7f00:1::1", "6to4 of loopback"),
    ("2002:a9fe:a9fe::1", "6to4 of metadata"),
    ("2002:c0a8:101::1", "6to4 of 192.168.1.1"),
    ("::127.0.0.1", "deprecated v4-compatible"),
    ("2001::1", "teredo"),
    ("100::1", "discard-only"),
    (ipaddress.ip_address("10.1.2.3"), "address object"),
    ("not an address", "garbage fails closed"),
    ("", "empty fails closed"),
]

PUBLIC = [
    "8.8.8.8",
    "1.1.1.1",
    "93.184.215.14",
    "11.0.0.1",
    "100.63.255.255",
    "100.128.0.1",
    "169.255.0.1",
    "172.32.0.1",
    "192.169.0.1",
    "198.20.0.1",
    "223.255.255.254",
    "2606:4700::1111",
    "2001:4860:4860::8888",
    "::ffff:8.8.8.8",
    "64:ff9b::808:808",
    "2002:808:808::1",
    "[2606:4700::1111]",
    ipaddress.ip_address("2606:4700::1111"),
]


@pytest.mark.parametrize(("address", "why"), BLOCKED, ids=[why for _, why in BLOCKED])
def test_it_blocks_non_public_addresses(address, why):
    assert is_blocked_address(address) is True


@pytest.mark.parametrize("address", PUBLIC, ids=[str(a) for a in PUBLIC])
def test_it_allows_public_addresses(address):
    assert is_blocked_address(address) is False


# --- check_url -------------------------------------------------------------

REFUSED_ALWAYS = [
    ("ftp://example.com/x", "scheme 'ftp'"),
    ("file:///etc/passwd", "scheme 'file'"),
    ("gopher://example.com/", "scheme 'gopher'"),
    ("example.com/path", "no scheme"),
    ("http:///path", "no host"),
    ("http:example.com", "no host"),
    ("https://user:pw@example.com/", "credentials"),
    ("https://user@example.com/", "credentials"),
    ("https://:@example.com/", "credentials"),
    # Legacy numeric IPv4 spellings that getaddrinfo maps to 127.0.0.1, and zone ids or escapes:
    # refused in the one message every refused host gets.
    ("http://2130706433/", HOST_REFUSED),
    ("http://017700000001/", HOST_REFUSED),
    ("http://0x7f000001/", HOST_REFUSED),
    ("http://0X7F.1/", HOST_REFUSED),
    ("http://127.1/", HOST_REFUSED),
    ("http://0177.0.0.1/", HOST_REFUSED),
    ("http://0/", HOST_REFUSED),
    ("http://127.0.0.1./", HOST_REFUSED),
    ("http://[fe80::1%25eth0]/", HOST_REFUSED),
    ("http://%31%32%37.0.0.1/", HOST_REFUSED),
]


@pytest.mark.parametrize("allow_private", [False, True])
@pytest.mark.parametrize(("url", "fragment"), REFUSED_ALWAYS)
def test_it_refuses_malformed_urls_even_when_private_is_allowed(url, fragment, allow_private):
    with pytest.raises(BlockedURL) as info:
        check_url(url, allow_private=allow_private)
    assert info.value.kind == "blocked"
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000/x",
        "http://[::1]/",
        "http://[0:0:0:0:0:0:0:1]/",
        "http://[::ffff:169.254.169.254]/latest/meta-data",
        "http://[::ffff:127.0.0.1]/",
        "http://169.254.169.254/latest/meta-data/",
        "http://[fd00:ec2::254]/",
        "http://100.100.100.200/",
        "http://10.0.0.5/",
        "http://0.0.0.0:8080/",
        "http://１２７.0.0.1/",  # fullwidth digits: yarl folds them to ASCII
    ],
)
def test_it_refuses_private_literals_unless_allowed(url):
    with pytest.raises(BlockedURL, match="private, loopback"):
        check_url(url, allow_private=False)
    assert isinstance(check_url(url, allow_private=True), URL)


def test_it_passes_names_to_the_resolver():
    # Names are not resolved here: the resolver judges them at connect time.
    assert check_url("https://localhost/x", allow_private=False).host == "localhost"
    assert check_url("https://api.example.com/v1?a=b", allow_private=False).query["a"] == "b"
    assert str(check_url("http://@example.com/", allow_private=False)) == "http://example.com/"


def test_yarl_keeps_integer_hosts_verbatim():
    # Why check_url spells out the numeric-host rule: yarl does not normalise
    # these, and getaddrinfo would turn them into 127.0.0.1.
    assert URL("http://2130706433/").host == "2130706433"
    assert URL("http://0x7f000001/").host == "0x7f000001"


def test_url_errors_do_not_echo_credentials_or_query():
    with pytest.raises(BlockedURL) as info:
        check_url(f"ftp://user:{SECRET}@example.com/?key={SECRET}", allow_private=True)
    assert SECRET not in str(info.value)
    with pytest.raises(BlockedURL) as info:
        check_url(f"http://user:{SECRET}@example.com/", allow_private=True)
    assert SECRET not in str(info.value)


# --- the resolver ----------------------------------------------------------


class FakeResolver:
    def __init__(self, answers):
        self.answers = answers
        self.closed = False

    async def resolve(self, host, port=0, family=socket.AF_INET):
        return [
            {"hostname": host, "host": a, "port": port, "family": 0, "proto": 0, "flags": 0} for a in self.answers[host]
        ]

    async def close(self):
        self.closed = True


def test_resolver_refuses_a_host_if_any_address_is_blocked():
    inner = FakeResolver({"mixed.test": ["93.184.215.14", "10.0.0.7"], "ok.test": ["8.8.8.8"]})
    guarded = GuardedResolver(allow_private=False, inner=inner)
    with pytest.raises(BlockedURL, match=re.escape(HOST_REFUSED)):
        run(guarded.resolve("mixed.test", 443))
    assert [r["host"] for r in run(guarded.resolve("ok.test", 443))] == ["8.8.8.8"]


def test_resolver_message_does_not_reveal_the_internal_address():
    guarded = GuardedResolver(allow_private=False, inner=FakeResolver({"db.corp": ["10.9.8.7"]}))
    with pytest.raises(BlockedURL) as info:
        run(guarded.resolve("db.corp", 5432))
    assert "10.9.8.7" not in str(info.value)


def test_resolver_passes_everything_when_private_is_allowed():
    inner = FakeResolver({"mixed.test": ["8.8.8.8", "127.0.0.1"]})
    guarded = GuardedResolver(allow_private=True, inner=inner)
    assert [r["host"] for r in run(guarded.resolve("mixed.test", 80))] == ["8.8.8.8", "127.0.0.1"]
    run(guarded.close())
    assert inner.closed


def test_resolver_catches_hex_hosts_should_check_url_be_skipped():
    # Defence in depth: glibc resolves "0x7f000001" to 127.0.0.1.
    async def scenario():
        guarded = GuardedResolver(allow_private=False)
        try:
            await guarded.resolve("0x7f000001", 80)
        finally:
            await guarded.close()

    try:
        socket.getaddrinfo("0x7f000001", 80)
    except socket.gaierror:
        pytest.skip("this libc does not resolve hex hosts")
    with pytest.raises(BlockedURL):
        run(scenario())


# --- requests against a real local server ----------------------------------


def test_it_posts_json_and_returns_status_headers_and_body():
    async def scenario():
        async with local_server() as srv, OutboundClient(allow_private=True) as client:
            response = await client.post_json(
                srv.url("/echo"),
                {"n": 1, "s": "é"},
                headers={"Authorization": f"Bearer {SECRET}"},
                timeout_s=5,
                accept="application/json, text/event-stream",
            )
            return srv, response

    srv, response = run(scenario())
    assert response.status == 200 and response.ok
    assert response.json() == {"got": {"n": 1, "s": "é"}}
    assert response.headers["content-type"].startswith("application/json")
    sent = srv.seen_headers["/echo"]
    # The guard forwards the caller's credentials; it only keeps them out of
    # messages and logs.
    assert sent["Authorization"] == f"Bearer {SECRET}"
    assert sent["Content-Type"] == "application/json"
    assert sent["Accept"] == "application/json, text/event-stream"


def test_it_deletes_without_a_body_and_under_the_same_guard():
    async def scenario():
        async with local_server() as srv:
            async with OutboundClient(allow_private=False) as client:
                with pytest.raises(BlockedURL):
                    await client.delete(srv.url("/session"), timeout_s=5)
                blocked_hits = srv.hits["/session"]
            async with OutboundClient(allow_private=True) as client:
                with pytest.raises(OutboundError) as bad_header:
                    await client.delete(srv.url("/session"), headers={"Mcp-Session-Id": "a\r\nb"}, timeout_s=5)
                response = await client.delete(
                    srv.url("/session"), headers={"Authorization": f"Bearer {SECRET}"}, timeout_s=5
                )
            return blocked_hits, bad_header.value, response, srv

    blocked_hits, bad_header, response, srv = run(scenario())
    assert blocked_hits == 0 and bad_header.kind == "invalid"
    assert response.status == 204 and srv.hits["/session"] == 1
    sent = srv.seen_headers["/session"]
    assert sent["Authorization"] == f"Bearer {SECRET}" and "Content-Type" not in sent


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"])
def test_it_never_reaches_a_loopback_server_when_private_is_blocked(host):
    async def scenario():
        async with local_server() as srv:
            async with OutboundClient(allow_private=False) as client:
                with pytest.raises(BlockedURL) as info:
                    await client.post_json(srv.url("/echo", host), {}, timeout_s=5)
            blocked_hits = srv.hits["/echo"]
            async with OutboundClient(allow_private=True) as client:
                response = await client.post_json(srv.url("/echo", host), {"a": 1}, timeout_s=5)
            return info.value, blocked_hits, response, srv.hits["/echo"]

    error, blocked_hits, response, total_hits = run(scenario())
    assert error.kind == "blocked"
    assert blocked_hits == 0
    assert response.status == 200
    assert total_hits == 1


def test_it_reads_the_allow_private_setting_lazily():
    pytest.importorskip("django")
    from django.conf import settings
    from django.test import override_settings

    if not settings.configured:
        pytest.skip("Django settings are not configured in this run")
    with override_settings(OPENRELAY_ALLOW_PRIVATE_URLS=True):
        assert OutboundClient().allow_private is True
    with override_settings(OPENRELAY_ALLOW_PRIVATE_URLS=False):
        assert OutboundClient().allow_private is False


def test_it_imports_and_defaults_to_blocking_without_django_settings():
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    code = "from openrelay.lib.outbound import OutboundClient; print(OutboundClient().allow_private)"
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_it_returns_redirects_without_following_them():
    async def scenario():
        async with local_server() as srv, OutboundClient(allow_private=True) as client:
            response = await client.post_json(srv.url("/redirect"), {}, timeout_s=5)
            return srv, response

    srv, response = run(scenario())
    assert response.status == 302
    assert not response.ok
    assert response.headers["location"] == "/target"
    assert srv.hits["/redirect"] == 1
    assert srv.hits["/target"] == 0


@pytest.mark.parametrize("path", ["/big", "/gzip"])
def test_it_stops_reading_past_the_size_cap(path):
    async def scenario():
        async with local_server() as srv, OutboundClient(allow_private=True) as client:
            with pytest.raises(OutboundError) as info:
                await client.post_json(srv.url(path), {}, timeout_s=5)
            # The pool is still usable afterwards.
            after = await client.post_json(srv.url("/echo"), {"x": 1}, timeout_s=5)
            return info.value, after

    error, after = run(scenario())
    assert error.kind == "too_large"
    assert str(CAP) in str(error)
    assert after.json() == {"got": {"x": 1}}


def test_it_honours_a_smaller_cap():
    async def scenario():
        async with local_server() as srv:
            async with OutboundClient(allow_private=True, max_response_bytes=10) as client:
                with pytest.raises(OutboundError) as info:
                    await client.post_json(srv.url("/echo"), {"long": "x" * 50}, timeout_s=5)
        return info.value

    assert run(scenario()).kind == "too_large"


def test_it_refuses_a_declared_length_over_the_cap_before_reading():
    head = f"HTTP/1.1 200 OK\r\nContent-Length: {ELEVEN_MB}\r\n\r\n{{}}".encode()

    async def scenario():
        async with raw_server(head) as url, OutboundClient(allow_private=True) as client:
            with pytest.raises(OutboundError) as info:
                await client.post_json(url, {}, timeout_s=5)
            return info.value

    assert run(scenario()).kind == "too_large"


def test_it_caps_a_body_without_content_length():
    # Read-until-close framing: only the running count can stop it.
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"

    async def scenario():
        server = raw_server(head, trailing=ELEVEN_MB)
        async with server as url, OutboundClient(allow_private=True) as client:
            with pytest.raises(OutboundError) as info:
                await client.post_json(url, {}, timeout_s=5)
            return info.value

    assert run(scenario()).kind == "too_large"


def test_an_understated_content_length_never_yields_more_than_declared():
    # aiohttp either stops at the declared 5 bytes or, when the excess
    # arrives in the same read, rejects it as a bad next status line.
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n[1,2]"

    async def scenario():
        server = raw_server(head, trailing=ELEVEN_MB)
        async with server as url, OutboundClient(allow_private=True) as client:
            try:
                return await client.post_json(url, {}, timeout_s=5)
            except OutboundError as exc:
                return exc

    outcome = run(scenario())
    if isinstance(outcome, OutboundError):
        assert outcome.kind == "transport"
        assert "yyy" not in str(outcome)
    else:
        assert outcome.body == b"[1,2]"


def test_it_times_out():
    async def scenario():
        async with local_server() as srv, OutboundClient(allow_private=True) as client:
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(OutboundError) as info:
                await client.post_json(srv.url("/slow"), {}, timeout_s=0.2)
            return info.value, loop.time() - started

    error, elapsed = run(scenario())
    assert error.kind == "timeout"
    assert "timed out after 0.2s" in str(error)
    assert elapsed < 2


def test_it_reports_malformed_json():
    async def scenario():
        async with local_server() as srv, OutboundClient(allow_private=True) as client:
            return await client.post_json(srv.url("/not-json"), {}, timeout_s=5)

    response = run(scenario())
    assert response.status == 200
    with pytest.raises(OutboundError) as info:
        response.json()
    assert info.value.kind == "malformed"


def test_it_reports_a_refused_connection_as_transport():
    port = free_port()

    async def scenario():
        async with OutboundClient(allow_private=True) as client:
            with pytest.raises(OutboundError) as info:
                await client.post_json(f"http://127.0.0.1:{port}/x", {}, timeout_s=5)
            return info.value

    error = run(scenario())
    assert error.kind == "transport"
    assert f"http://127.0.0.1:{port}: could not connect" in str(error)


def test_it_refuses_payloads_json_cannot_carry():
    async def scenario():
        async with OutboundClient(allow_private=True) as client:
            with pytest.raises(OutboundError) as info:
                await client.post_json("http://127.0.0.1:9/", {"n": 2**70}, timeout_s=5)
            return info.value

    assert run(scenario()).kind == "invalid"


def test_it_refuses_header_injection_without_echoing_the_value():
    async def scenario():
        async with OutboundClient(allow_private=True) as client:
            with pytest.raises(OutboundError) as info:
                await client.post_json(
                    "http://127.0.0.1:9/",
                    {},
                    headers={"Authorization": f"Bearer {SECRET}\r\nX-Evil: 1"},
                    timeout_s=5,
                )
            return info.value

    error = run(scenario())
    assert error.kind == "invalid"
    assert "Authorization" in str(error)
    assert SECRET not in str(error)


def test_it_must_be_entered_first():
    async def scenario():
        await OutboundClient(allow_private=True).post_json("http://127.0.0.1:9/", {}, timeout_s=1)

    with pytest.raises(RuntimeError, match="async with"):
        run(scenario())


def test_no_error_message_carries_secrets():
    headers = {"Authorization": f"Bearer {SECRET}", "X-Api-Key": SECRET}
    query = f"?api_key={SECRET}"
    closed = free_port()

    async def scenario():
        errors = []
        async with local_server() as srv:
            attempts = [
                (False, srv.url(f"/echo{query}", "localhost")),  # blocked by the resolver
                (False, srv.url(f"/echo{query}")),  # blocked literal
                (True, srv.url(f"/slow{query}")),  # timeout
                (True, srv.url(f"/big{query}")),  # too_large
                (True, f"http://127.0.0.1:{closed}/p/{SECRET}{query}"),  # transport
                (True, f"http://no-such-host.invalid/{SECRET}{query}"),  # dns
            ]
            for allow_private, url in attempts:
                async with OutboundClient(allow_private=allow_private) as client:
                    try:
                        await client.post_json(url, {}, headers=headers, timeout_s=0.5)
                    except OutboundError as exc:
                        errors.append(exc)
        return errors

    errors = run(scenario())
    assert {e.kind for e in errors} == {"blocked", "timeout", "too_large", "transport"}
    assert len(errors) == 6
    for error in errors:
        assert SECRET not in str(error)
        assert SECRET not in repr(error)
        assert "api_key" not in str(error)


def test_response_headers_are_lower_case_and_joined():
    from openrelay.lib.outbound import _lower_headers

    raw = CIMultiDict([("X-Thing", "a"), ("x-thing", "b"), ("Content-Type", "text/plain")])
    assert _lower_headers(raw) == {"x-thing": "a, b", "content-type": "text/plain"}


def test_response_is_frozen():
    response = OutboundResponse(status=200, headers={}, body=b"{}")
    with pytest.raises(AttributeError):
        response.status = 500  # type: ignore[misc]


# --- redaction -------------------------------------------------------------


def test_redact_headers_hides_secrets_and_copies():
    original = {
        "Authorization": f"Bearer {SECRET}",
        "proxy-authorization": "Basic abc",
        "X-API-Key": SECRET,
        "api-key": SECRET,
        "Cookie": "session=1",
        "Content-Type": "application/json",
    }
    redacted = redact_headers(original)
    assert redacted == {
        "Authorization": "[redacted]",
        "proxy-authorization": "[redacted]",
        "X-API-Key": "[redacted]",
        "api-key": "[redacted]",
        "Cookie": "[redacted]",
        "Content-Type": "application/json",
    }
    assert original["Authorization"] == f"Bearer {SECRET}"


def test_redact_headers_accepts_multidicts_pairs_and_none():
    multi = CIMultiDict([("Authorization", "x"), ("Accept", "*/*")])
    assert redact_headers(multi) == {"Authorization": "[redacted]", "Accept": "*/*"}
    assert redact_headers([("cookie", "a")]) == {"cookie": "[redacted]"}
    assert redact_headers(None) == {}
