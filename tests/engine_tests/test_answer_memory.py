"""A hostile model server can't blow up a worker: a gzip bomb and a 100 MB answer, each sent to a
real worker cluster (one engine process) with a 64 MB answer cap, grow the worker by less than the
cap + 50 MB, and the record fails as a failed server would (sent three times, then alone), naming
the cap."""

import asyncio
import threading
import zlib
from pathlib import Path

import psutil
import pytest

from batches.models import Record
from openrelay.core.models import Deployment, Model
from tests.helpers import MODEL, chat, make_batch, wait_for

CAP = 64 * 1024 * 1024
MB = 1024 * 1024
ZEROS = b"\0" * MB


def _gzip_bomb(inflated):
    """gzip of `inflated` zero bytes, made a megabyte at a time (~1 KB on the wire per MB)."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, 31)
    return b"".join(deflate.compress(ZEROS) for _ in range(inflated // MB)) + deflate.flush()


class HostileModelServer:
    """Answers "warm" requests like a model, others with `attack`: 100 MB streamed or a gzip bomb."""

    def __init__(self, attack):
        self.attack = attack
        self.bomb = _gzip_bomb(1024 * MB) if attack == "gzip bomb" else b""
        self.attacks = 0
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()

    def __enter__(self):
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.ready.wait(10)
        return self

    def __exit__(self, *exc):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def _run(self):
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()

    async def _serve(self, reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    ),
                    0,
                )
                body = await reader.readexactly(length)
                if head.startswith(b"GET") or b"warm" in body:  # health probes, the warm-up record
                    answer = b'{"choices": [{"message": {"role": "assistant", "content": "ok"}}], "data": []}'
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(answer), answer))
                    continue
                self.attacks += b"attack" in body  # the record's calls (the engine's neutral requests are attacked too)
                await self._attack(writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _attack(self, writer):
        if self.attack == "gzip bomb":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(self.bomb))
            writer.write(self.bomb)
            await writer.drain()
            return
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")  # no length to refuse up front
        for _ in range(100):
            writer.write(b"%x\r\n%s\r\n" % (MB, ZEROS))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()


def _kb(pid, field):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _workers(cluster):
    return [p.pid for p in psutil.Process(cluster.process.pid).children(recursive=True)]


def _finished(batch, line):
    return Record.objects.filter(batch=batch, line=line).exclude(status__in=["pending", "running"]).first()


@pytest.mark.slow
@pytest.mark.parametrize("attack", ["gzip bomb", "100 MB answer"])
def test_a_hostile_answer_fails_as_a_failed_server_and_the_worker_stays_small(
    transactional_db, alice, clusters, attack
):
    with HostileModelServer(attack) as server:
        model = Model.objects.create(name=MODEL)
        Deployment.objects.create(
            model=model, base_url=f"http://127.0.0.1:{server.port}/v1", upstream_model="m", max_concurrency=4
        )
        cluster = clusters(OPENRELAY_Q_WORKERS=1, OPENRELAY_MAX_MODEL_RESPONSE_BYTES=CAP)
        warm = make_batch(alice.org, [chat("warm")])
        wait_for(lambda: _finished(warm, 1), 60, "the warm-up record")
        before = {pid: _kb(pid, "VmRSS") for pid in _workers(cluster)}

        batch = make_batch(alice.org, [chat("attack")])
        record = wait_for(lambda: _finished(batch, 1), 120, "the attacked record") and _finished(batch, 1)

        grown_mb = max(_kb(pid, "VmHWM") - rss for pid, rss in before.items()) / 1024
        assert grown_mb < (CAP / MB) + 50, f"a worker grew {grown_mb:.0f} MB"
        assert record.status == "failed" and record.error_code == "upstream_error"
        assert record.error_message.startswith("The model server failed 3 times while this request was in flight")
        assert f"{CAP}-byte cap" in record.error_message
        assert server.attacks == 3
