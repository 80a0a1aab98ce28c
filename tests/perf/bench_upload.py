"""Benchmark: upload a ~200 MB batch input through a real server (not collected by pytest).

    .venv/bin/python -m tests.perf.bench_upload                    # daphne
    .venv/bin/python -m tests.perf.bench_upload --server uvicorn   # for comparison

Generates a 50,000-record JSONL file in a temp dir, migrates a fresh SQLite
database in a temp OPENRELAY_DATA_DIR, starts the ASGI server on a free port
in a subprocess, uploads the file with httpx (streamed from disk) and
downloads it back. Reports MB/s (MB = 2**20 bytes, as in the 200 MB limit)
and the server process's peak RSS growth over its idle RSS, sampled with
psutil. Goals: >= 150 MB/s and < 100 MB of RSS growth for the upload.
`run()` returns the numbers for a future `manage.py bench`.
"""

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson

from openrelay.lib import children
from tests.perf.common import PeakRss, wait_http

RECORDS = 50_000
LINE_BYTES = 4_000  # ~200 MB in all, under the 209,715,200-byte limit
MB = 1024 * 1024
SPEED_GOAL_MB_S, RSS_GOAL_MB = 150, 100
ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable


def write_input(path, records=RECORDS, line_bytes=LINE_BYTES):
    """Write `records` chat lines of about `line_bytes` each, streaming."""
    filler = ("lorem ipsum dolor sit amet " * (line_bytes // 27 + 1))[: line_bytes - 200]
    with open(path, "wb") as out:
        for i in range(records):
            line = {
                "custom_id": f"doc-{i // 90:04d}-page-{i % 90:03d}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": "openrelay/gemma-4-31b",
                    "max_tokens": 256,
                    "messages": [{"role": "user", "content": f"{i} {filler}"}],
                },
            }
            out.write(orjson.dumps(line) + b"\n")
    return path.stat().st_size


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _manage(env, *args):
    result = children.run([PYTHON, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return result.stdout.strip().splitlines()


def _server_command(server, port):
    if server == "uvicorn":
        return [
            PYTHON,
            "-m",
            "uvicorn",
            "openrelay.asgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--lifespan",
            "off",
            "--http",
            "openrelay.web.webserver:HttpToolsProtocol",
        ]  # the protocol `up` and production run
    return [PYTHON, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "openrelay.asgi:application"]


def _upload(base, key, path):
    with open(path, "rb") as stream:
        started = time.perf_counter()
        response = httpx.post(
            f"{base}/v1/files",
            files={"file": (path.name, stream, "application/jsonl")},
            data={"purpose": "batch"},
            headers={"Authorization": f"Bearer {key}"},
            timeout=300,
        )
        elapsed = time.perf_counter() - started
    response.raise_for_status()
    return response.json(), elapsed


def _download(base, key, file_id, expected):
    started = time.perf_counter()
    size = 0
    with httpx.stream(
        "GET",
        f"{base}/v1/files/{file_id}/content",
        timeout=300,
        headers={"Authorization": f"Bearer {key}", "Accept": "application/binary"},
    ) as response:
        response.raise_for_status()
        for chunk in response.iter_raw(MB):
            size += len(chunk)
    if size != expected:
        raise RuntimeError(f"downloaded {size} bytes, expected {expected}")
    return time.perf_counter() - started


def run(report=print, server="daphne", records=RECORDS):
    with tempfile.TemporaryDirectory(prefix="openrelay-bench-upload-") as tmp:
        tmp = Path(tmp)
        path = tmp / "requests.jsonl"
        size = write_input(path, records)
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
        env.update(OPENRELAY_DATA_DIR=str(tmp / "data"), DJANGO_SETTINGS_MODULE="openrelay.settings")
        _manage(env, "migrate", "--noinput", "-v", "0")
        key = _manage(env, "create_org", "bench")[-1]
        port = _free_port()
        base = f"http://127.0.0.1:{port}"
        process = children.popen(
            _server_command(server, port), cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        try:
            wait_http(process, f"{base}/v1/files")
            httpx.get(f"{base}/v1/files", headers={"Authorization": f"Bearer {key}"}).raise_for_status()  # warm up
            with PeakRss(process.pid) as upload_rss:
                file, upload_s = _upload(base, key, path)
            with PeakRss(process.pid) as download_rss:
                download_s = _download(base, key, file["id"], size)
        finally:
            process.terminate()
            process.wait(timeout=10)
    results = {
        "server": server,
        "bytes": size,
        "upload_s": round(upload_s, 3),
        "upload_mb_s": round(size / MB / upload_s, 1),
        "upload_rss_growth_mb": round(upload_rss.growth_mb, 1),
        "server_idle_rss_mb": round(upload_rss.start / MB, 1),
        "download_s": round(download_s, 3),
        "download_mb_s": round(size / MB / download_s, 1),
        "download_rss_growth_mb": round(download_rss.growth_mb, 1),
    }
    report(
        f"{server}: uploaded {size / MB:.1f} MB in {upload_s:.2f} s = {results['upload_mb_s']} MB/s "
        f"(goal >= {SPEED_GOAL_MB_S}), server RSS +{results['upload_rss_growth_mb']} MB (goal < {RSS_GOAL_MB}); "
        f"downloaded in {download_s:.2f} s = {results['download_mb_s']} MB/s, RSS +{results['download_rss_growth_mb']} MB"
    )
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", choices=["daphne", "uvicorn"], default="daphne")
    parser.add_argument("--records", type=int, default=RECORDS)
    args = parser.parse_args(argv)
    return run(server=args.server, records=args.records)


if __name__ == "__main__":
    main()
