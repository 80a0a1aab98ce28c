"""Load test: 100 clients polling `GET /v1/batches/{id}` while 10 batches run (not collected by pytest).

    .venv/bin/python -m tests.perf.load_polling                         # SQLite, ORM broker
    .venv/bin/python -m tests.perf.load_polling \\
        --database-url postgres://postgres@127.0.0.1:5432/postgres --redis-url redis://127.0.0.1:6379/9

Starts a throwaway gateway on loopback, the way `manage.py up` runs one:
a fresh data dir and database (a new SQLite file, or a new PostgreSQL
database created next to the one named and dropped afterwards), the
simulated model server, the ASGI web server (uvicorn) and a qcluster. It
creates 10 batches through the API, then 100 concurrent clients (one
asyncio loop, one aiohttp session) poll the batches round-robin until every
batch is finished or the time limit passes, whichever is first; the request
count is bounded too. Every address is 127.0.0.1: nothing leaves the machine.

Prints one JSON report: requests, errors (any non-200 answer or transport
failure), throughput, latency percentiles of the polls, and each batch's
final status. Exits 1 when any poll failed.
"""

import argparse
import asyncio
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import httpx
import orjson

from openrelay.lib import children
from tests.perf.common import wait_http

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
MODEL = "openrelay/gemma-4-31b"
TERMINAL = {"completed", "failed", "expired", "cancelled"}


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _percentile(values, q):
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))
    return ordered[index]


class Gateway:
    """Throwaway data dir, database and subprocesses, all on 127.0.0.1."""

    def __init__(self, tmp, database_url=None, redis_url=None, workers=2, sim_latency_ms=50):
        self.tmp = tmp
        self.processes = []
        self.admin_url = None
        if database_url:
            parts = urlsplit(database_url)
            self.db_name = f"load_polling_{secrets.token_hex(4)}"
            self.admin_url = database_url
            self._psql(f'CREATE DATABASE "{self.db_name}"')
            database_url = urlunsplit(parts._replace(path="/" + self.db_name))
        else:
            database_url = f"sqlite:///{tmp / 'load.sqlite3'}"
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("OPENRELAY_") and k not in ("DATABASE_URL", "REDIS_URL")
        }
        self.env.update(
            OPENRELAY_DATA_DIR=str(tmp / "data"),
            DATABASE_URL=database_url,
            SECRET_KEY="load-" + secrets.token_hex(16),
            OPENRELAY_LOG_LEVEL="WARNING",
            OPENRELAY_Q_WORKERS=str(workers),
            OPENRELAY_BATCH_CREATE_RATE="1000/minute",
        )
        if redis_url:
            self._check_loopback(redis_url)
            import redis

            redis.Redis.from_url(redis_url).flushdb()  # this run's own index: stale tasks would steal workers
            self.env["REDIS_URL"] = redis_url
        self.sim_latency_ms = sim_latency_ms

    @staticmethod
    def _check_loopback(url):
        host = urlsplit(url).hostname
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise SystemExit(f"{url}: the load test only talks to loopback addresses")

    def _psql(self, sql):
        import psycopg

        self._check_loopback(self.admin_url)
        with psycopg.connect(self.admin_url, autocommit=True) as connection:
            connection.execute(sql)

    def manage(self, *args):
        result = children.run(
            [PYTHON, "manage.py", *args], cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=300
        )
        if result.returncode:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{result.stderr[-3000:]}")
        return result.stdout

    def spawn(self, name, argv):
        log = open(self.tmp / f"{name}.log", "wb")
        process = children.popen(
            argv, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        self.processes.append(process)
        return process

    def start(self):
        self.manage("migrate", "--verbosity", "0")
        sim_port = _free_port()
        sim = self.spawn(
            "simulator",
            [
                PYTHON,
                "-m",
                "openrelay.simulator",
                "--host",
                "127.0.0.1",
                "--port",
                str(sim_port),
                "--latency-ms",
                str(self.sim_latency_ms),
                "--no-record",
            ],
        )
        wait_http(sim, f"http://127.0.0.1:{sim_port}/v1/models")
        key = (
            self.manage(
                "shell",
                "-c",
                (
                    "from django.core.management import call_command\n"
                    "from openrelay.core.models import ApiKey, Organization\n"
                    f"call_command('set_model', {MODEL!r}, base_url='http://127.0.0.1:{sim_port}/v1', concurrency=64,"
                    " stdout=open('/dev/null', 'w'))\n"
                    "org = Organization.objects.create(name='load-test')\n"
                    "print(ApiKey.issue(org, 'load test')[1])\n"
                ),
            )
            .strip()
            .splitlines()[-1]
        )
        self.spawn("qcluster", [PYTHON, "manage.py", "qcluster"])
        web_port = _free_port()
        web = self.spawn(
            "web",
            [
                PYTHON,
                "-m",
                "uvicorn",
                "--host",
                "127.0.0.1",
                "--port",
                str(web_port),
                "--no-access-log",
                "openrelay.asgi:application",
            ],
        )
        self.base = f"http://127.0.0.1:{web_port}"
        wait_http(web, f"{self.base}/v1/openapi.json")
        return key

    def close(self):
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        if self.admin_url:
            self._psql(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)')


def create_batches(base, key, count, records):
    client = httpx.Client(base_url=f"{base}/v1", headers={"Authorization": f"Bearer {key}"}, timeout=120)
    ids = []
    for b in range(count):
        lines = b"".join(
            orjson.dumps(
                {
                    "custom_id": f"b{b}-r{i}",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": {"model": MODEL, "messages": [{"role": "user", "content": f"batch {b} q {i}"}]},
                }
            )
            + b"\n"
            for i in range(records)
        )
        file_id = (
            client.post("/files", files={"file": ("in.jsonl", lines, "application/jsonl")}, data={"purpose": "batch"})
            .raise_for_status()
            .json()["id"]
        )
        batch = (
            client.post(
                "/batches",
                json={"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"},
            )
            .raise_for_status()
            .json()
        )
        ids.append(batch["id"])
    return ids


async def poll(base, key, batch_ids, clients, max_seconds, max_requests):
    latencies, errors, statuses = [], [], {}
    sent = 0
    deadline = time.monotonic() + max_seconds
    headers = {"Authorization": f"Bearer {key}"}
    connector = aiohttp.TCPConnector(limit=clients)
    timeout = aiohttp.ClientTimeout(total=30)

    async with aiohttp.ClientSession(connector=connector, headers=headers, timeout=timeout) as session:

        async def client(n):
            nonlocal sent
            index = n
            while time.monotonic() < deadline and sent < max_requests:
                if len(statuses) == len(batch_ids) and all(s in TERMINAL for s in statuses.values()):
                    return
                batch_id = batch_ids[index % len(batch_ids)]
                index += 1
                sent += 1
                started = time.perf_counter()
                try:
                    async with session.get(f"{base}/v1/batches/{batch_id}") as response:
                        body = await response.read()
                        elapsed = time.perf_counter() - started
                        if response.status != 200:
                            errors.append(f"HTTP {response.status}: {body[:200]!r}")
                            continue
                        statuses[batch_id] = orjson.loads(body)["status"]
                        latencies.append(elapsed)
                except (TimeoutError, aiohttp.ClientError) as exc:
                    errors.append(f"{type(exc).__name__}: {exc}")

        started = time.monotonic()
        await asyncio.gather(*(client(n) for n in range(clients)))
        elapsed = time.monotonic() - started
    return latencies, errors, statuses, sent, elapsed


def run(
    database_url=None,
    redis_url=None,
    clients=100,
    batches=10,
    records=1000,
    max_seconds=120,
    max_requests=200_000,
    workers=2,
    sim_latency_ms=50,
):
    with tempfile.TemporaryDirectory(prefix="load-polling-") as tmp:
        gateway = Gateway(Path(tmp), database_url, redis_url, workers=workers, sim_latency_ms=sim_latency_ms)
        try:
            key = gateway.start()
            batch_ids = create_batches(gateway.base, key, batches, records)
            latencies, errors, statuses, sent, elapsed = asyncio.run(
                poll(gateway.base, key, batch_ids, clients, max_seconds, max_requests)
            )
        finally:
            gateway.close()
        web_log = (Path(tmp) / "web.log").read_text(errors="replace").splitlines()
    ms = [round(v * 1000, 1) for v in latencies]
    return {
        "database": "postgresql" if database_url else "sqlite",
        "broker": "redis" if redis_url else "orm",
        "clients": clients,
        "batches": batches,
        "records_per_batch": records,
        "requests": sent,
        "ok": len(latencies),
        "errors": len(errors),
        "error_samples": errors[:5],
        "elapsed_s": round(elapsed, 1),
        "requests_per_s": round(len(latencies) / elapsed, 1) if elapsed else None,
        "latency_ms": {
            "p50": _percentile(ms, 50),
            "p95": _percentile(ms, 95),
            "p99": _percentile(ms, 99),
            "max": max(ms) if ms else None,
        },
        "batch_statuses": sorted(statuses.values()),
        # What the web server logged about failed requests (it logs nothing else at WARNING).
        "web_log_tail": web_log[-60:] if errors else [],
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", help="a PostgreSQL server on loopback (a fresh database is created on it)")
    parser.add_argument("--redis-url", help="a Redis index on loopback for the broker (flushed first)")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--records", type=int, default=1000, help="records per batch")
    parser.add_argument("--max-seconds", type=float, default=120)
    parser.add_argument("--max-requests", type=int, default=200_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--sim-latency-ms", type=float, default=50)
    args = parser.parse_args(argv)
    report = run(
        args.database_url,
        args.redis_url,
        args.clients,
        args.batches,
        args.records,
        args.max_seconds,
        args.max_requests,
        args.workers,
        args.sim_latency_ms,
    )
    sys.stdout.write(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n")
    sys.exit(1 if report["errors"] else 0)


if __name__ == "__main__":
    main()
