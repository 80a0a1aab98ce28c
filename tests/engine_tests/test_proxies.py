"""Model calls honour HTTP_PROXY, HTTPS_PROXY and NO_PROXY, against a real forwarding proxy on 127.0.0.1:
http:// servers get absolute-form requests through it, https:// ones a CONNECT tunnel with TLS
to the server inside; NO_PROXY hosts are called directly."""

import asyncio
import base64
import ssl
import subprocess

import pytest

from batches.engine.calls.caller import ModelCaller, Upstream
from batches.engine.calls.transport import Origin, ProxyRefused, ServerDisconnected
from tests.engine_tests.test_transport import JSON, Script, _ok, _post, _run


class Proxy:
    """A forwarding HTTP proxy: absolute-form requests and CONNECT, each relayed to its target."""

    def __init__(self, refuse=False, hosts=None):
        self.seen = []  # (request line, Proxy-Authorization or None)
        self.refuse = refuse
        self.hosts = hosts or {}  # names only the proxy resolves (egress-restricted deployments)
        self.tasks = set()

    async def __aenter__(self):
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc):
        self.server.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _serve(self, reader, writer):
        self.tasks.add(asyncio.current_task())
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            line, *headers = head.decode("latin-1").split("\r\n")
            auth = next(
                (h.split(":", 1)[1].strip() for h in headers if h.lower().startswith("proxy-authorization")), None
            )
            self.seen.append((line, auth))
            method, target, _ = line.split(" ")
            if self.refuse:
                writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
                return
            if method == "CONNECT":
                host, port = target.rsplit(":", 1)
                up_reader, up_writer = await asyncio.open_connection(self.hosts.get(host, host), int(port))
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                authority, _, path = target.removeprefix("http://").partition("/")
                host, port = authority.rsplit(":", 1)
                up_reader, up_writer = await asyncio.open_connection(self.hosts.get(host, host), int(port))
                up_writer.write(head.replace(target.encode(), b"/" + path.encode(), 1))
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


async def _pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


@pytest.fixture
def no_proxies(monkeypatch):
    for name in (
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "http_proxy",
        "https_proxy",
        "no_proxy",
        "ALL_PROXY",
        "all_proxy",
    ):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_http_servers_are_called_through_http_proxy_with_its_credentials(no_proxies):
    async def go():
        async with Proxy() as proxy, Script([_ok(), _ok()]) as server:
            no_proxies.setenv("HTTP_PROXY", f"http://user:p%40ss@127.0.0.1:{proxy.port}")
            upstream = Upstream(f"http://127.0.0.1:{server.port}/v1", "m", "sk-1", 4)
            async with ModelCaller([upstream], time_limit_s=10, retries=0) as caller:
                result = await caller.call("/v1/chat/completions", {"messages": []})
            return result, proxy.seen, server.requests

    result, seen, requests = _run(go())
    assert result.ok and result.body == {"ok": True}
    [(line, auth)] = seen
    assert line.startswith("POST http://127.0.0.1:") and line.endswith("/v1/chat/completions HTTP/1.1")
    assert auth == "Basic " + base64.b64encode(b"user:p@ss").decode()
    assert b"Authorization: Bearer sk-1\r\n" in requests[0][1]


def test_https_servers_are_called_through_a_connect_tunnel(no_proxies, tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    server_side = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_side.load_cert_chain(cert, key)

    async def go():
        async with Proxy() as proxy, Script([_ok(), _ok()], ssl_context=server_side) as server:
            no_proxies.setenv("HTTPS_PROXY", f"http://127.0.0.1:{proxy.port}")
            origin = Origin(
                f"https://127.0.0.1:{server.port}/v1",
                connect_timeout_s=5,
                ssl_context=ssl.create_default_context(cafile=str(cert)),
            )
            answers = [await _post(origin), await _post(origin)]
            return answers, proxy.seen, server.requests, server.port

    answers, seen, requests, port = _run(go())
    assert [a.body for a in answers] == [JSON, JSON]
    assert seen == [(f"CONNECT 127.0.0.1:{port} HTTP/1.1", None)]  # one tunnel, kept alive for both
    assert requests[0][1].startswith(b"POST /v1/chat/completions HTTP/1.1")  # origin-form inside the tunnel


def test_no_proxy_hosts_are_called_directly(no_proxies):
    async def go():
        async with Proxy() as proxy, Script([_ok()]) as server:
            no_proxies.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.port}")
            no_proxies.setenv("NO_PROXY", "localhost,127.0.0.1")
            answer = await _post(Origin(f"http://127.0.0.1:{server.port}/v1", connect_timeout_s=5))
            return answer, proxy.seen

    answer, seen = _run(go())
    assert answer.body == JSON and seen == []


def test_a_proxy_that_refuses_the_tunnel_fails_the_server(no_proxies):
    async def go():
        async with Proxy(refuse=True) as proxy:
            no_proxies.setenv("HTTPS_PROXY", f"http://127.0.0.1:{proxy.port}")
            with pytest.raises(ProxyRefused):
                await _post(Origin("https://api.example.com/v1", connect_timeout_s=5))

    _run(go())


def test_a_proxy_url_this_transport_cannot_use_makes_the_deployment_unusable(no_proxies):
    no_proxies.setenv("HTTPS_PROXY", "socks5://127.0.0.1:1080")
    upstream = Upstream("https://api.example.com/v1", "m", "", 4)
    assert upstream.origin is None and "proxy URL must be http://" in upstream.problem


def test_a_tunnel_lost_as_its_tls_handshake_ends_fails_the_server(no_proxies):
    # start_tls returns None when the connection is lost between the end of the handshake and its return
    # (asyncio's SSLProtocol drops its transport): a disconnect that fails the server, and the tunnel is dropped.
    async def go():
        async with Proxy() as proxy, Script([]) as server:
            no_proxies.setenv("HTTPS_PROXY", f"http://127.0.0.1:{proxy.port}")
            tunnels = []

            async def lost(transport, protocol, sslcontext, **kw):
                tunnels.append(transport)
                return None

            no_proxies.setattr(asyncio.get_running_loop(), "start_tls", lost)
            with pytest.raises(ServerDisconnected):
                await _post(Origin(f"https://127.0.0.1:{server.port}/v1", connect_timeout_s=5))
            return tunnels

    [tunnel] = _run(go())
    assert tunnel.is_closing()
