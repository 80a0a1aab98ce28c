"""Request heads are capped at OPENRELAY_MAX_HEADER_BYTES (64 KB) in all: past it, 431 in the error
envelope, from real servers on 127.0.0.1. uvicorn as `manage.py up` runs it (openrelay.web.webserver's
httptools protocol) and with h11 refuses while reading, holding no more than the cap and a read;
uvicorn without those protocols gets the 431 from the application (HeaderCap); daphne's own
parser refuses heads over 16 KB (a 400, or the connection dropped) before the application sees them."""

import contextlib
import socket
import threading
from pathlib import Path

import orjson
import pytest

from tests.clients_tests.conftest import _listening, start
from tests.helpers import free_port, wait_for

APP = "openrelay.asgi:application"
UVICORN = ["-m", "uvicorn", "--host", "127.0.0.1", "--no-access-log", "--log-level", "warning"]
SERVERS = {
    "uvicorn httptools (up)": UVICORN + ["--http", "openrelay.web.webserver:HttpToolsProtocol", APP],
    "uvicorn h11": UVICORN + ["--http", "openrelay.web.webserver:H11Protocol", APP],
    "uvicorn default": UVICORN + [APP],
}
CAP = 64 * 1024


def _serve(argv, tmp_path_factory):
    data_dir, port = tmp_path_factory.mktemp("web"), free_port()
    process = start("web", [*argv, "--port", str(port)], data_dir)
    try:
        wait_for(lambda: _listening(process, port), 30, "the web server to listen")
        yield port, process
    finally:
        process.stop()


@pytest.fixture(scope="module", params=sorted(SERVERS))
def server(request, django_db_setup, tmp_path_factory):
    yield from _serve(SERVERS[request.param], tmp_path_factory)


@pytest.fixture(scope="module", params=["uvicorn httptools (up)", "uvicorn h11"])
def shipped_server(request, django_db_setup, tmp_path_factory):
    yield from _serve(SERVERS[request.param], tmp_path_factory)


def _head(header_bytes, path="/v1/openapi.json"):
    """A GET whose head is `header_bytes` long in all."""
    start = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n".encode()
    filler = header_bytes - len(start) - len(b"X-Filler: \r\n\r\n")
    return start + b"X-Filler: " + b"a" * filler + b"\r\n\r\n"


def _ask(port, request):
    """(status, body) of the answer, reading while the request is still being sent."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sender = threading.Thread(target=_send_quietly, args=(sock, request))
        sender.start()
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass  # the server closed with our bytes unread: what it sent first is what counts
        sender.join()
    if not answer:
        return None, b""  # dropped without an answer
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


def _send_quietly(sock, data):
    try:
        sock.sendall(data)
    except OSError:
        pass  # refused mid-send


def _rss_peak_kb(pid):
    status = Path(f"/proc/{pid}/status").read_text()
    return {
        k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in status.splitlines()) if k in ("VmRSS", "VmHWM")
    }


def test_a_head_up_to_the_cap_is_served(server):
    port, _ = server
    assert _ask(port, _head(CAP))[0] == 200


@pytest.mark.parametrize("size", [CAP + 1, 8 * 1024 * 1024])
def test_a_head_over_the_cap_is_431_in_the_error_envelope(server, size):
    port, _ = server
    status, body = _ask(port, _head(size))
    assert status == 431
    error = orjson.loads(body[body.index(b"{") : body.rindex(b"}") + 1])["error"]
    assert error["code"] == "request_headers_too_large" and "65536 bytes" in error["message"]


def test_the_shipped_protocols_refuse_while_reading_not_after_holding_it_all(shipped_server):
    port, process = shipped_server
    before = _rss_peak_kb(process.popen.pid)["VmRSS"]
    assert _ask(port, _head(64 * 1024 * 1024))[0] == 431
    grown_mb = (_rss_peak_kb(process.popen.pid)["VmHWM"] - before) / 1024
    assert grown_mb < 16, f"the server grew {grown_mb:.0f} MB reading a 64 MB head"


def test_daphne_refuses_big_heads_itself(django_db_setup, tmp_path_factory):
    data_dir, port = tmp_path_factory.mktemp("daphne"), free_port()
    process = start("daphne", ["-m", "daphne", "-b", "127.0.0.1", "-p", str(port), APP], data_dir)
    try:
        wait_for(lambda: _listening(process, port), 30, "daphne to listen")
        assert _ask(port, _head(8 * 1024))[0] == 200
        # Twisted's 16 KB limit on a head: a 400, or the connection dropped before the answer got out.
        assert _ask(port, _head(8 * 1024 * 1024))[0] in (400, None)
    finally:
        process.stop()


@pytest.fixture(params=["uvicorn httptools (up)", "uvicorn h11"])
def impatient_server(request, django_db_setup, tmp_path_factory, monkeypatch):
    monkeypatch.setenv("OPENRELAY_HEADER_TIMEOUT_S", "1")
    yield from _serve(SERVERS[request.param], tmp_path_factory)


def _answer_and_close(sock):
    """What the server sends before it closes the connection ({sock}'s timeout bounds the wait)."""
    answer = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


@pytest.mark.parametrize("sent", [b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ", b""])
def test_a_head_that_does_not_arrive_in_time_is_408_and_closed(impatient_server, sent):
    # The red team's slow client: half a head (or nothing), then silence. uvicorn alone held it forever.
    port, _ = impatient_server
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(sent)
        answer = _answer_and_close(sock)  # returns once the server closes; 30 s if it never does
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert orjson.loads(answer.partition(b"\r\n\r\n")[2])["error"]["code"] == "request_head_timeout"


def test_a_kept_alive_connection_gets_the_deadline_again_for_its_next_head(impatient_server):
    port, _ = impatient_server
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        answer = b""
        for served in (1, 2):  # two whole requests, each within the deadline: both served
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            while answer.count(b"HTTP/1.1 200 ") < served:
                answer += sock.recv(65536)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        answer += _answer_and_close(sock)
    assert answer.count(b"HTTP/1.1 200 ") == 2 and answer.count(b"HTTP/1.1 408 ") == 1, answer
