"""A tokenizer server that counts: every call, and the most calls it ever had in flight at once.

vLLM's `POST /tokenize` as the quote uses it (`messages` or `prompt` -> `count`), on 127.0.0.1, a
thread a connection, each answer held `latency_s` so that calls sent at once overlap on the server
as they would on a real one (a tokenizer answers in ~1-5 ms).
"""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import orjson


class CountingTokenizer:
    def __init__(self, latency_s=0.005):
        self.latency_s = latency_s
        self.calls = 0
        self.in_flight = 0
        self.peak = 0
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), _handler(self))
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self):
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self._server.shutdown()
        self._server.server_close()

    def reset(self):
        with self._lock:
            self.calls = self.peak = 0

    def entered(self):
        with self._lock:
            self.calls += 1
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)

    def left(self):
        with self._lock:
            self.in_flight -= 1


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # 48 quotes' connections at once: the default backlog (5) would drop some


def _handler(counter):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the quote's httpx client reuses its connections
        # The head and the body go in two writes: with Nagle's algorithm on, the body waited for the
        # client's delayed ACK, 40 ms a call (a quote of 25 records took 0.4 s instead of 0.05 s).
        disable_nagle_algorithm = True

        def do_POST(self):
            body = orjson.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if self.path != "/tokenize":
                return self._answer(404, {"error": {"message": "not found"}})
            counter.entered()
            try:
                threading.Event().wait(counter.latency_s)  # the tokenizer's own time on the request
                text = orjson.dumps(body.get("messages") or body.get("prompt") or "")
            finally:
                # Out of flight before the answer leaves: the client frees its slot only once it has the
                # answer, so a call it sends next is never counted beside this one.
                counter.left()
            self._answer(200, {"count": 3 + len(text) // 4})

        def _answer(self, status, payload):
            data = orjson.dumps(payload)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    return Handler
