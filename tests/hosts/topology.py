"""The product on hosts in network namespaces, as docs/guides/many-machines.md lays it out.

| host | runs | address |
| --- | --- | --- |
| db | a private PostgreSQL 15 cluster (initdb), as the postgres user | 198.18.0.2 |
| redis | redis-server | 198.18.0.3 |
| s3 | moto's S3 server (the `moto[server]` test extra), the bucket | 198.18.0.4 |
| web | compose.yaml's `migrate`, then its `web` (uvicorn) | 198.18.0.5 |
| model | the simulated model server, counting calls by client address | 198.18.0.7 |
| ops | nothing: the test's own client thread lives here (`Topology.ops`) | 198.18.0.9 |
| work1, work2 | compose.yaml's `worker` (`manage.py qcluster`, its default workers) | 198.18.0.11, .12 |

The product's processes get only what compose.yaml declares, filled with the operator's values (the
variables production.md and many-machines.md tell an operator to set), plus the documented settings a
test passes (`OPENRELAY_LEASE_S`). Nothing of the test process's own environment leaks in.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg

from openrelay.lib import children
from tests.helpers import ROOT
from tests.hosts import recipe
from tests.hosts.netns import Inside, Network, check_namespaces_work, run_prefix, sweep

HOSTS = {"db": 2, "redis": 3, "s3": 4, "web": 5, "model": 7, "ops": 9, "work1": 11, "work2": 12}
WORKERS = ("work1", "work2")
# A record's statuses once it is done (batches.models.RecordStatus): what the invariants and the faults count.
FINISHED_RECORDS = ("succeeded", "failed", "expired", "cancelled")
PG_BIN = Path("/usr/lib/postgresql/15/bin")
BUCKET = "openrelay-files"
S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "hosts", "AWS_SECRET_ACCESS_KEY": "hosts-secret"}
# What a process gets of the machine: a PATH and a locale, as a unit or a container would.
BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


def wait_until(predicate, what: str, timeout: float, every: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(every)
    return value


class HostProcess:
    """A program running on a host, in its own process group, logging to `<logs>/<host>-<name>.log`."""

    def __init__(
        self,
        network: Network,
        host: str,
        name: str,
        argv: list[str],
        env: dict[str, str],
        logs: Path,
        release: Path = ROOT,
    ):
        self.host, self.name, self.release = host, name, release
        self.log_path = logs / f"{host}-{name}.log"
        self.log = open(self.log_path, "ab")
        self.popen = children.popen(
            network.argv(host, argv),
            cwd=release,
            env=env,
            start_new_session=True,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def send(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)

    def running(self) -> bool:
        return self.popen.poll() is None

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout=timeout)

    def stop(self, sig: int = signal.SIGKILL, timeout: float = 30) -> None:
        self.send(signal.SIGCONT)
        self.send(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=timeout)
        self.send(signal.SIGKILL)
        self.popen.wait(timeout=10)
        self.log.close()

    def tail(self, size: int = 3000) -> str:
        self.log.flush()
        return self.log_path.read_bytes()[-size:].decode(errors="replace")


class Topology:
    """Builds the hosts and starts every part; `close()` removes all of it (idempotent)."""

    def __init__(self, logs: Path, settings: dict[str, str]):
        check_namespaces_work()
        self.logs = logs
        self.settings = settings
        self.prefix = run_prefix()
        sweep(self.prefix)
        self.processes: dict[str, HostProcess] = {}
        self.network = Network(self.prefix)
        self.address = {host: self.network.add(host, octet) for host, octet in HOSTS.items()}
        self.inside = Inside(self.network, "ops")
        self.pg_dir = Path(tempfile.mkdtemp(prefix=f"{self.prefix}-pg-"))
        self.data = Path(tempfile.mkdtemp(prefix=f"{self.prefix}-data-"))
        self.secret_key = os.urandom(24).hex()
        self._previous: tuple[Path, str] | None = None  # previous_release(): its tree, the commit after it
        self.web_url = f"http://{self.address['web']}:8000"
        self.model_url = f"http://{self.address['model']}:8001"

    # --- the operator's values ------------------------------------------------------------

    @property
    def database_url(self) -> str:
        return f"postgres://postgres@{self.address['db']}:5432/openrelay"

    def operator_values(self, host: str) -> dict[str, str]:
        """What many-machines.md tells an operator to set on each machine; each host its own data dir."""
        return {
            "DATABASE_URL": self.database_url,
            "REDIS_URL": f"redis://{self.address['redis']}:6379/0",
            "SECRET_KEY": self.secret_key,
            "ALLOWED_HOSTS": self.address["web"],
            "OPENRELAY_STORAGE_URL": (
                f"s3://{BUCKET}/files?endpoint_url=http://{self.address['s3']}:5000"
                "&region=us-east-1&addressing_style=path"
            ),
            "OPENRELAY_DATA_DIR": str(self.data / host),
            **S3_CREDENTIALS,
        }

    def product(self, service: str, host: str, release: Path = ROOT) -> tuple[list[str], dict[str, str]]:
        """compose.yaml's `service` for `host`: its command and environment, as `release` (a tree of the
        product: this checkout, or an earlier version's, `previous_release`) declares and runs them."""
        argv, env = recipe.service(service, self.operator_values(host), release / "deploy" / "compose.yaml")
        return recipe.local_argv(argv), {**BASE_ENV, "PYTHONPATH": str(release), **env, **self.settings}

    # --- starting ------------------------------------------------------------------------

    def start(self) -> Topology:
        self.start_db()
        self.start_redis()
        self.start_s3()
        self.start_model()
        self.migrate()
        # The web and the workers start together (each takes seconds to import on a loaded machine).
        argv, env = self.product("web", "web")
        self.run("web", "web", argv, env)
        for host in WORKERS:
            self.start_worker(host)
        self.wait_listening("web", 8000)
        return self

    def run(
        self, host: str, name: str, argv: list[str], env: dict[str, str] | None = None, release: Path = ROOT
    ) -> HostProcess:
        self.processes[name] = HostProcess(self.network, host, name, argv, env or BASE_ENV, self.logs, release)
        return self.processes[name]

    def listens(self, host: str, port: int) -> bool:
        def connect():
            try:
                socket.create_connection((self.address[host], port), timeout=0.5).close()
                return True
            except OSError:
                return False

        return self.ops(connect)

    def wait_listening(self, name: str, port: int, timeout: float = 60) -> None:
        process = self.processes[name]

        def ready():
            assert process.running(), f"{name} exited ({process.popen.returncode}); its log ends:\n{process.tail()}"
            return self.listens(process.host, port)

        wait_until(ready, f"{name} to listen on {process.host}:{port}", timeout)

    def start_db(self) -> None:
        if not (self.pg_dir / "PG_VERSION").exists():
            shutil.chown(self.pg_dir, "postgres", "postgres")
            as_postgres = ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups"]
            subprocess.run(
                [*as_postgres, str(PG_BIN / "initdb"), "-D", str(self.pg_dir), "-U", "postgres", "-A", "trust"],
                check=True,
                capture_output=True,
                env=BASE_ENV,
                timeout=120,
            )
            with open(self.pg_dir / "pg_hba.conf", "a") as hba:
                hba.write("host all all 198.18.0.0/15 trust\n")
        argv = [
            "setpriv",
            "--reuid=postgres",
            "--regid=postgres",
            "--init-groups",
            str(PG_BIN / "postgres"),
            "-D",
            str(self.pg_dir),
            "-c",
            f"listen_addresses={self.address['db']}",
            "-c",
            f"unix_socket_directories={self.pg_dir}",
            # A throwaway cluster: no fsync (the machine's disk is shared by every helper's tests).
            "-c",
            "fsync=off",
            "-c",
            "synchronous_commit=off",
            "-c",
            "full_page_writes=off",
        ]
        self.run("db", "postgres", argv)
        self.wait_listening("postgres", 5432)
        wait_until(self._accepts_queries, "PostgreSQL to accept queries", 60)

    def _accepts_queries(self) -> bool:
        """True once PostgreSQL answers (creating the product's database the first time)."""

        def ask():
            url = f"postgres://postgres@{self.address['db']}:5432/postgres"
            with psycopg.connect(url, autocommit=True, connect_timeout=5) as connection:
                if not connection.execute("SELECT 1 FROM pg_database WHERE datname = 'openrelay'").fetchone():
                    connection.execute("CREATE DATABASE openrelay")
            return True

        try:
            return self.ops(ask)
        except psycopg.OperationalError:
            return False

    def stop_db(self) -> None:
        # SIGINT: PostgreSQL's fast shutdown (sessions cut, a clean checkpoint), as `pg_ctl stop -m fast`.
        self.processes.pop("postgres").stop(signal.SIGINT, timeout=60)

    def start_redis(self) -> None:
        argv = ["redis-server", "--bind", self.address["redis"], "--port", "6379", "--save", "", "--appendonly", "no"]
        self.run("redis", "redis", [*argv, "--protected-mode", "no"])
        self.wait_listening("redis", 6379)

    def start_s3(self) -> None:
        self.run("s3", "moto", [recipe.local_argv(["moto_server"])[0], "-H", self.address["s3"], "-p", "5000"])
        self.wait_listening("moto", 5000)
        self.ops(lambda: httpx.put(f"http://{self.address['s3']}:5000/{BUCKET}", timeout=10).raise_for_status())

    def start_model(self) -> None:
        argv = [recipe.local_argv(["python"])[0], "-m", "openrelay.simulator", "--host", self.address["model"]]
        self.run("model", "model", [*argv, "--port", "8001", "--no-record", "--model", "sim-upstream"])
        self.wait_listening("model", 8001)

    def migrate(self) -> None:
        argv, env = self.product("migrate", "web")
        migrate = self.run("web", "migrate", argv, env)
        code = migrate.wait(timeout=180)
        assert code == 0, f"migrate exited {code}:\n{migrate.tail()}"

    def start_web(self) -> None:
        argv, env = self.product("web", "web")
        self.run("web", "web", argv, env)
        self.wait_listening("web", 8000)

    def start_worker(self, host: str, release: Path = ROOT) -> HostProcess:
        argv, env = self.product("worker", host, release)
        return self.run(host, host, argv, env, release)

    def previous_release(self) -> Path:
        """The product as it was one schema change ago, where a rolling deploy's old workers run from:
        `git archive` of the first parent of the last commit (on the first-parent line) that added a
        migration, unpacked once. Its workers run with the same interpreter (its dependencies are
        this checkout's: pyproject's pins moved with none of those migrations)."""
        if self._previous is None:
            added = subprocess.run(
                ["git", "log", "--first-parent", "-1", "--format=%H", "--diff-filter=A", "--", "*/migrations/0*.py"],
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            tree = Path(tempfile.mkdtemp(prefix=f"{self.prefix}-previous-"))
            archive = subprocess.run(
                ["git", "archive", "--format=tar", f"{added}^1"], cwd=ROOT, capture_output=True, check=True
            )
            subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
            self._previous = (tree, added)
        return self._previous[0]

    def manage(self, *args: str) -> str:
        """`python manage.py ...` on the web host, as an operator runs one there; its output."""
        argv, env = self.product("web", "web")
        done = subprocess.run(
            self.network.argv("web", [recipe.local_argv(["python"])[0], "manage.py", *args]),
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    # --- reaching the hosts --------------------------------------------------------------

    def ops(self, function, *args, **kwargs):
        """Runs `function` on the ops host (its sockets are opened there)."""
        return self.inside.run(function, *args, **kwargs)

    def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        def run():
            with psycopg.connect(self.database_url, connect_timeout=5) as connection:
                return connection.execute(query, params).fetchall()

        return self.ops(run)

    def finished_records(self, batch_id: str) -> int:
        """The records of batch `batch_id` (its public id) finished in the database, by a read of its own."""
        query = (
            "SELECT count(*) FROM batches_record r JOIN batches_batch b ON r.batch_id = b.id "
            "WHERE b.public_id = %s AND r.status = ANY(%s)"
        )
        return self.sql(query, batch_id, list(FINISHED_RECORDS))[0][0]

    def sim_calls(self) -> dict[str, Any]:
        return self.ops(lambda: httpx.get(self.model_url + "/_sim/calls", timeout=10).json())

    def sim_reset(self) -> None:
        self.ops(lambda: httpx.post(self.model_url + "/_sim/reset", timeout=10).raise_for_status())

    def engines(self) -> int:
        return self.sql("SELECT count(*) FROM batches_engine")[0][0]

    def engines_of(self, host: str) -> set[str]:
        """The owners of the engine rows whose process runs on `host` (in its cluster's process group)."""
        group = self.processes[host].popen.pid
        pids = set()
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, IndexError, ValueError):
                if int(stat.read_bytes().rsplit(b")", 1)[1].split()[2]) == group:
                    pids.add(int(stat.parent.name))
        return {owner for owner, pid in self.sql("SELECT owner, pid FROM batches_engine") if pid in pids}

    # --- faults --------------------------------------------------------------------------

    def pause(self, host: str) -> None:
        self.processes[host].send(signal.SIGSTOP)

    def resume(self, host: str) -> None:
        self.processes[host].send(signal.SIGCONT)

    def restart_worker(self, host: str) -> None:
        if host in self.processes:
            self.processes.pop(host).stop()
        self.start_worker(host)

    def heal(self) -> None:
        """Every link up, every drop rule gone, every process running: the next scenario's start."""
        for host in HOSTS:
            self.network.heal(host)
            self.network.undrop(host)
        for host in WORKERS:
            self.resume(host)
        if "postgres" not in self.processes or not self.processes["postgres"].running():
            self.processes.pop("postgres", None)
            self.start_db()
        if "redis" not in self.processes or not self.processes["redis"].running():
            self.processes.pop("redis", None)
            self.start_redis()
        if not self.processes["web"].running():
            self.start_web()
        for host in WORKERS:
            if host not in self.processes or not self.processes[host].running():
                self.start_worker(host)

    # --- teardown ------------------------------------------------------------------------

    def close(self) -> None:
        for process in list(self.processes.values())[::-1]:
            with contextlib.suppress(Exception):  # teardown goes on whatever one stop raised
                process.stop()
        self.processes.clear()
        self.inside.close()
        self.network.remove()
        shutil.rmtree(self.pg_dir, ignore_errors=True)
        shutil.rmtree(self.data, ignore_errors=True)
        if self._previous is not None:
            shutil.rmtree(self._previous[0], ignore_errors=True)


class Client:
    """The API as a client on the ops host sees it: an organization's key, over HTTP to the web host."""

    def __init__(self, topology: Topology, key: str, web_url: str | None = None):
        self.topology = topology
        self.headers = {"Authorization": f"Bearer {key}"}
        self.web_url = web_url or topology.web_url  # another web (a previous release's) where given

    def call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        def send():
            return httpx.request(
                method,
                self.web_url + path,
                headers={**self.headers, **kwargs.pop("headers", {})},
                timeout=kwargs.pop("timeout", 30),
                **kwargs,
            )

        return self.topology.ops(send)

    def upload(self, lines: list[dict[str, Any]], idempotency_key: str | None = None) -> httpx.Response:
        body = b"".join(orjson.dumps(line) + b"\n" for line in lines)
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self.call(
            "POST", "/v1/files", files={"file": ("in.jsonl", body)}, data={"purpose": "batch"}, headers=headers
        )

    def create(self, lines: list[dict[str, Any]]) -> dict[str, Any]:
        upload = self.upload(lines)
        assert upload.status_code == 200, upload.text
        created = self.call(
            "POST",
            "/v1/batches",
            json={"input_file_id": upload.json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"},
        )
        assert created.status_code == 200, created.text
        return created.json()

    def batch(self, batch_id: str) -> dict[str, Any]:
        got = self.call("GET", f"/v1/batches/{batch_id}")
        assert got.status_code == 200, got.text
        return got.json()

    def cancel(self, batch_id: str) -> dict[str, Any]:
        cancelled = self.call("POST", f"/v1/batches/{batch_id}/cancel")
        assert cancelled.status_code == 200, cancelled.text
        return cancelled.json()

    def lines(self, file_id: str | None) -> list[dict[str, Any]]:
        if not file_id:
            return []
        got = self.call("GET", f"/v1/files/{file_id}/content", timeout=60)
        assert got.status_code == 200, got.text
        return [orjson.loads(line) for line in got.content.splitlines()]
