"""Reading a 200 MB batch input's lines from object storage (issue 23), against moto's S3 server:

    .venv/bin/python tests/perf/bench_object_storage.py [--mb 200]

Uploads a JSONL file of chat lines through Django's storage (django-storages' S3 backend), then
reads every line by offset and length in line order, as an engine reads its claimed records:
once through files.storage.open_records (ranged GETs of RANGE_BYTES) and once through the
backend's own file object (which downloads the object whole on the first read). Prints the
time, the GETs and the reader's peak RSS growth for each.
"""

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from openrelay.lib import children

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def moto():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = children.popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return process, f"http://127.0.0.1:{port}"
        assert time.monotonic() < deadline
        time.sleep(0.05)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=200)
    args = parser.parse_args()
    process, endpoint = moto()
    try:
        os.environ.update(
            {
                "AWS_ACCESS_KEY_ID": "bench",
                "AWS_SECRET_ACCESS_KEY": "bench",
                "AWS_DEFAULT_REGION": "us-east-1",
                "OPENRELAY_DATA_DIR": tempfile.mkdtemp(prefix="s3bench-"),
                "OPENRELAY_LOG_LEVEL": "WARNING",
                "OPENRELAY_STORAGE_URL": f"s3://bench/files?endpoint_url={endpoint}&addressing_style=path",
                "DJANGO_SETTINGS_MODULE": "openrelay.settings",
            }
        )
        import boto3
        import django
        import orjson

        django.setup()
        from django.core.files import File
        from django.core.files.storage import default_storage

        from files import storage
        from tests.perf.common import PeakRss

        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="bench")
        spans, offset = [], 0
        with tempfile.TemporaryFile() as f:
            i = 0
            while offset < args.mb * 2**20:
                line = (
                    orjson.dumps(
                        {
                            "custom_id": f"req-{i}",
                            "method": "POST",
                            "url": "/v1/chat/completions",
                            "body": {"model": "m", "messages": [{"role": "user", "content": "x" * 3800}]},
                        }
                    )
                    + b"\n"
                )
                f.write(line)
                spans.append((offset, len(line)))
                offset += len(line)
                i += 1
            f.seek(0)
            started = time.perf_counter()
            name = default_storage.save("bench/in.jsonl", File(f, name="in.jsonl"))
            print(f"uploaded {offset / 2**20:.0f} MB ({len(spans):,} lines) in {time.perf_counter() - started:.1f} s")
        for label, open_ in (
            ("ranged (open_records)", lambda: storage.open_records(default_storage, name)),
            ("backend file (S3File)", lambda: default_storage.open(name, "rb")),
        ):
            with PeakRss() as rss:
                started = time.perf_counter()
                reader, read = open_(), 0
                for start, length in spans:
                    reader.seek(start)
                    read += len(reader.read(length))
                reader.close()
                took = time.perf_counter() - started
            assert read == offset
            print(f"{label}: {took:.2f} s ({offset / 2**20 / took:.0f} MB/s), peak RSS +{rss.growth_mb:.0f} MB")
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


if __name__ == "__main__":
    main()
