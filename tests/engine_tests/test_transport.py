"""The model-call transport against scripted HTTP servers on 127.0.0.1.

Each server is a real asyncio server that reads one request at a time and
answers with the bytes a test gives it, so the shapes real model servers
use (chunked, close-delimited, gzip, Connection: close, 1xx, TLS) and the
broken ones (garbage, a close mid-answer) are each exercised on the wire.
"""

import asyncio
import gzip
import ssl
import subprocess
import zlib

import orjson
import pytest

from batches.engine.calls.caller import ModelCaller, Upstream
from batches.engine.calls.transport import KEEPALIVE_S, BadResponse, Origin, ServerDisconnected

JSON = b'{"ok":true}'


def _ok(body=JSON, headers=b""):
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s" % (
        len(body),
        headers,
        body,
    )


class Script:
    """A server that answers the n-th request on any connection with answers[n] (bytes or a callable)."""

    def __init__(self, answers, ssl_context=None):
        self.answers = list(answers)
        self.requests = []  # (connection number, head bytes, body bytes)
        self.connections = 0
        self.ssl = ssl_context
        self.handlers = set()

    async def __aenter__(self):
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.ssl)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc):
        self.server.close()
        for handler in self.handlers:
            handler.cancel()
        await asyncio.gather(*self.handlers)

    async def _serve(self, reader, writer):
        self.handlers.add(asyncio.current_task())
        self.connections += 1
        number = self.connections
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(
                    next(
                        line.split(b":")[1]
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    )
                )
                body = await reader.readexactly(length)
                self.requests.append((number, head, body))
                answer = self.answers[len(self.requests) - 1]
                if callable(answer):
                    await answer(writer)
                else:
                    writer.write(answer)
                    await writer.drain()
                if writer.is_closing():
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except asyncio.CancelledError:
            pass  # the test is over (a cancelled handler would be logged as an error by asyncio)
        finally:
            writer.close()


async def _close(writer):
    writer.close()


def _run(coro):
    return asyncio.run(coro)


def _origin(port, scheme="http", path="/v1", **kw):
    return Origin(f"{scheme}://127.0.0.1:{port}{path}", connect_timeout_s=5, **kw)


async def _post(origin, body=b"{}", headers=None):
    head = origin.prepare("/chat/completions", headers or {"Content-Type": "application/json"})
    return await origin.post(head, body)


def test_a_request_goes_out_as_prepared_and_the_connection_is_kept_alive():
    async def go():
        async with Script([_ok(headers=b"x-request-id: req_1\r\n")] * 3) as server:
            origin = _origin(server.port)
            answers = [await _post(origin, b'{"n":%d}' % n, {"Authorization": "Bearer sk"}) for n in range(3)]
            origin.close()
            return server, answers

    server, answers = _run(go())
    assert [(a.status, a.body, a.headers["x-request-id"]) for a in answers] == [(200, JSON, "req_1")] * 3
    assert server.connections == 1  # one connection, reused
    _, head, body = server.requests[2]
    assert head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{server.port}\r\n".encode() in head and b"Authorization: Bearer sk\r\n" in head
    assert b"Content-Length: 7\r\n" in head and body == b'{"n":2}'


def test_a_chunked_answer_is_reassembled():
    chunked = b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{"ok\r\n7\r\n":true}\r\n0\r\n\r\n'

    async def go():
        async with Script([chunked, _ok()]) as server:
            origin = _origin(server.port)
            first, second = await _post(origin), await _post(origin)
            return server.connections, first, second

    connections, first, second = _run(go())
    assert first.body == JSON and second.body == JSON and connections == 1


def test_an_answer_without_a_length_runs_until_the_server_closes():
    async def close_delimited(writer):
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + JSON)
        await writer.drain()
        writer.close()

    async def go():
        async with Script([close_delimited, _ok()]) as server:
            origin = _origin(server.port)
            first, second = await _post(origin), await _post(origin)
            return server.connections, first, second

    connections, first, second = _run(go())
    assert first.body == JSON and second.body == JSON
    assert connections == 2  # the closed connection was not reused


def test_connection_close_is_honoured():
    async def go():
        async with Script([_ok(headers=b"Connection: close\r\n"), _ok()]) as server:
            origin = _origin(server.port)
            await _post(origin)
            await _post(origin)
            return server.connections

    assert _run(go()) == 2


def test_a_connection_the_server_closed_while_idle_is_not_reused():
    async def answer_then_close(writer):
        writer.write(_ok())  # says keep-alive (HTTP/1.1 default), then closes anyway
        await writer.drain()
        writer.close()

    async def go():
        async with Script([answer_then_close, _ok()]) as server:
            origin = _origin(server.port)
            await _post(origin)
            await asyncio.sleep(0.05)  # let the close arrive (the server's doing, not work to wait for)
            second = await _post(origin)
            return server.connections, second

    connections, second = _run(go())
    assert second.status == 200 and connections == 2


def test_a_connection_idle_past_the_keepalive_is_replaced(monkeypatch):
    async def go():
        async with Script([_ok(), _ok()]) as server:
            origin = _origin(server.port)
            await _post(origin)
            origin._idle[-1].idle_since -= KEEPALIVE_S + 1  # as if it sat idle that long
            await _post(origin)
            return server.connections

    assert _run(go()) == 2


@pytest.mark.parametrize(
    "encoding, compress",
    [
        (b"gzip", gzip.compress),
        (b"deflate", zlib.compress),
        (b"deflate", lambda data: zlib.compress(data)[2:-4]),  # raw deflate, as some servers send it
    ],
)
def test_compressed_bodies_are_decoded(encoding, compress):
    body = compress(JSON)

    async def go():
        async with Script([_ok(body, b"Content-Encoding: " + encoding + b"\r\n")]) as server:
            return await _post(_origin(server.port))

    assert _run(go()).body == JSON


def test_an_interim_answer_is_skipped():
    async def go():
        async with Script([b"HTTP/1.1 100 Continue\r\n\r\n" + _ok()]) as server:
            return await _post(_origin(server.port))

    answer = _run(go())
    assert (answer.status, answer.body) == (200, JSON)


@pytest.mark.parametrize(
    "answer, error",
    [
        (b"this is not http\r\n\r\n", BadResponse),
        (b'HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{"cut', ServerDisconnected),
        (b"HTTP/1.1 200 OK\r\nContent-Encoding: br\r\nContent-Length: 2\r\n\r\n{}", BadResponse),
        (b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 2\r\n\r\n{}", BadResponse),
    ],
)
def test_broken_answers_raise_and_the_connection_is_dropped(answer, error):
    async def cut_short(writer):
        writer.write(answer)
        await writer.drain()
        if error is ServerDisconnected:
            writer.close()

    async def go():
        async with Script([cut_short, _ok()]) as server:
            origin = _origin(server.port)
            with pytest.raises(error):
                await _post(origin)
            after = await _post(origin)
            return server.connections, after

    connections, after = _run(go())
    assert after.status == 200 and connections == 2


def test_a_cancelled_exchange_leaves_no_connection_behind():
    async def never(writer):
        await asyncio.sleep(3600)

    async def go():
        async with Script([never, _ok()]) as server:
            origin = _origin(server.port)
            call = asyncio.create_task(_post(origin))
            while not server.requests:  # the request reached the server
                await asyncio.sleep(0.01)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            after = await _post(origin)
            return server.connections, after, origin._idle

    connections, after, idle = _run(go())
    assert after.status == 200 and connections == 2 and len(idle) == 1


def test_tls(tmp_path):
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
        async with Script([_ok(), _ok()], ssl_context=server_side) as server:
            trusting = ssl.create_default_context(cafile=str(cert))
            answer = await _post(_origin(server.port, "https", ssl_context=trusting))
            with pytest.raises(ssl.SSLCertVerificationError):  # the system's CAs don't know this certificate
                await _post(_origin(server.port, "https"))
            return answer

    assert _run(go()).body == JSON


def test_the_host_header_and_request_target():
    assert (
        Origin("https://api.example.com/v1/", connect_timeout_s=1)
        .prepare("/embeddings", {})
        .startswith(b"POST /v1/embeddings HTTP/1.1\r\nHost: api.example.com\r\n")
    )
    assert b"Host: [::1]:8000\r\n" in Origin("http://[::1]:8000", connect_timeout_s=1).prepare("/x", {})


@pytest.mark.parametrize("headers", [{"Authorization": "Bearer a\r\nX-Evil: 1"}, {"X-Bad:": "v"}, {"X": "a\x00"}])
def test_header_injection_is_refused(headers):
    with pytest.raises(ValueError):
        Origin("http://127.0.0.1:1/v1", connect_timeout_s=1).prepare("/x", headers)


@pytest.mark.parametrize("base_url, api_key", [("ftp://127.0.0.1/v1", ""), ("http://127.0.0.1:9/v1", "sk\r\nX: y")])
def test_an_unusable_deployment_sends_nothing_and_stays_out_of_the_rotation(base_url, api_key):
    """The operator's mistake, never the record's: its calls wait (for a fixed deployment or the
    batch's end) instead of failing, and the reason is on the deployment."""

    async def go():
        upstream = Upstream(base_url, "m", api_key, 4)
        async with ModelCaller([upstream], time_limit_s=5, retries=0) as caller:
            waiting = asyncio.create_task(caller.call("/v1/chat/completions", {"messages": []}))
            await asyncio.sleep(0.3)
            waiting.cancel()
            return waiting, upstream

    waiting, upstream = _run(go())
    assert waiting.cancelled() and not upstream.healthy
    assert upstream.last_error.startswith("The model server's settings are not usable")


def test_the_caller_reads_status_request_id_and_retry_after_from_the_transport():
    busy = b"HTTP/1.1 429 Too Many\r\nRetry-After: 0\r\nContent-Length: 2\r\n\r\n{}"
    usage = orjson.dumps({"id": "x", "usage": {"prompt_tokens": 3, "completion_tokens": 2}})

    async def go():
        async with Script([busy, _ok(usage, b"X-Request-Id: req_abc\r\n")]) as server:
            upstreams = [Upstream(f"http://127.0.0.1:{server.port}/v1", "m", "", 4)]
            async with ModelCaller(upstreams, time_limit_s=5, retries=1) as caller:
                return server, await caller.call("/v1/chat/completions", {"messages": []})

    server, result = _run(go())
    assert result.ok and result.request_id == "req_abc" and result.usage.total_tokens == 5
    assert len(server.requests) == 2 and orjson.loads(server.requests[1][2]) == {"messages": [], "model": "m"}


# --- real servers: uvicorn, as vLLM and most OpenAI-compatible servers run ----


async def _asgi_echo(scope, receive, send):
    """A model server's shape: read the JSON body, answer JSON with a request id."""
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    answer = orjson.dumps({"echo": orjson.loads(body), "path": scope["path"]})
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json"), (b"x-request-id", b"req_uv")],
        }
    )
    await send({"type": "http.response.body", "body": answer})


@pytest.fixture(params=["h11", "httptools"])
def uvicorn_server(request):
    import threading
    import time

    import uvicorn

    server = uvicorn.Server(
        uvicorn.Config(
            _asgi_echo,
            host="127.0.0.1",
            port=0,
            http=request.param,
            log_level="warning",
            lifespan="off",
            timeout_keep_alive=1,
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    yield server.servers[0].sockets[0].getsockname()[1]
    server.should_exit = True
    thread.join(timeout=5)


def test_concurrent_calls_to_uvicorn_reuse_their_connections(uvicorn_server):
    async def go():
        origin = _origin(uvicorn_server)
        answers = await asyncio.gather(*(_post(origin, orjson.dumps({"n": n})) for n in range(200)))
        return answers, len(origin._idle)

    answers, idle = _run(go())
    assert [orjson.loads(a.body)["echo"]["n"] for a in answers] == list(range(200))
    assert {(a.status, a.headers["x-request-id"], orjson.loads(a.body)["path"]) for a in answers} == {
        (200, "req_uv", "/v1/chat/completions")
    }
    assert 1 <= idle <= 200


def test_a_connection_uvicorn_closed_for_idleness_is_replaced_not_failed(uvicorn_server):
    async def go():
        origin = _origin(uvicorn_server)
        await _post(origin)
        [connection] = origin._idle
        # uvicorn closes keep-alive connections idle for its timeout_keep_alive (1 s here).
        deadline = asyncio.get_running_loop().time() + 10
        while connection.open:
            assert asyncio.get_running_loop().time() < deadline, "uvicorn kept the connection"
            await asyncio.sleep(0.05)
        return await _post(origin), origin._idle[0] is not connection

    answer, replaced = _run(go())
    assert answer.status == 200 and replaced
