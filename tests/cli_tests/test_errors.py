"""Exit codes 1 and 2, error envelopes on stderr, and the API key kept out of every output."""

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.cli_tests.conftest import CHAT, chat, write_jsonl


def test_it_exits_1_with_the_envelope_for_an_unknown_id(orl):
    result = orl("batches", "get", "batch_nope")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert "Error: No batch found with id 'batch_nope'." in result.stderr
    assert "HTTP 404  type: not_found_error" in result.stderr
    assert f"GET {orl.base_url}/batches/batch_nope" in result.stderr


def test_it_exits_1_naming_the_url_it_could_not_reach(orl):
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dead = f"http://127.0.0.1:{port}/v1"
    result = orl("files", "list", base_url=dead)
    assert result.exit_code == 1
    assert f"Could not reach {dead}/files" in result.stderr


def test_it_exits_2_without_an_api_key(orl):
    result = orl("batches", "list", key=None)
    assert result.exit_code == 2
    assert "No API key: set OPENRELAY_API_KEY or pass --api-key." in result.stderr


def test_it_exits_2_for_a_missing_input_file(orl, tmp_path):
    result = orl("batches", "create", "--input-file", tmp_path / "absent.jsonl", "--endpoint", CHAT)
    assert result.exit_code == 2
    assert "does not exist" in result.stderr


def test_it_exits_2_for_bad_metadata(orl, tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", chat("a"))
    result = orl("batches", "create", "-f", path, "-e", CHAT, "--metadata", "no-equals-sign")
    assert result.exit_code == 2
    assert "expected key=value" in result.stderr


def test_it_prefers_the_flags_over_the_environment(orl, alice, bob, tmp_path):
    file_id = json.loads(orl("--json", "files", "create", write_jsonl(tmp_path / "in.jsonl", chat("a"))).stdout)["id"]
    # The environment says bob (who can't see alice's file) on a dead port; the flags say alice on the live server.
    result = orl(
        "--api-key",
        alice.key,
        "--base-url",
        orl.base_url,
        "files",
        "get",
        file_id,
        key=bob.key,
        base_url="http://127.0.0.1:9/v1",
    )
    assert result.exit_code == 0, result.output
    assert file_id in result.stdout


def test_it_never_prints_the_key_even_when_it_is_refused(orl, alice):
    wrong = alice.key[:-4] + "zzzz"
    result = orl("--json", "batches", "list", key=wrong)
    assert result.exit_code == 1
    assert "authentication_error" in result.stderr
    assert wrong not in result.stdout + result.stderr


class _EchoingHandler(BaseHTTPRequestHandler):
    """A careless server that quotes the Authorization header back in its error."""

    def do_GET(self):
        body = json.dumps(
            {
                "error": {
                    "message": f"Rejected {self.headers['Authorization']}",
                    "type": "x",
                    "param": self.headers["Authorization"],
                    "code": None,
                }
            }
        ).encode()
        self.send_response(400)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_it_masks_the_key_when_a_server_echoes_it(orl):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _EchoingHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        result = orl("batches", "get", "batch_x", base_url=f"http://127.0.0.1:{server.server_port}/v1")
    finally:
        server.shutdown()
        server.server_close()
    assert result.exit_code == 1
    assert "Rejected Bearer ***" in result.stderr and "param: Bearer ***" in result.stderr
