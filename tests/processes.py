"""The one way the tests start the product's processes: web servers, worker clusters, any `python` child.

Every child runs in its own session (process group), as systemd or docker runs it, so one
`killpg` stops it with whatever it forked; it dies with the test run however that run ends
(openrelay.lib.children); its output goes to a log file under the data dir the test gives it,
which a failure quotes.

- `Process`: one child. `cluster(data_dir, **env)` and `web(kind, data_dir, **env)` start the
  product's two kinds; `start(name, argv, data_dir, **env)` any other `python` program.
- `Processes`: a group started for one test or one module, all stopped at once.

The environment (`product_env`) points the child at the test database and the data dir;
keyword arguments add to it or override it (`OPENRELAY_Q_WORKERS=4`).
"""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from openrelay.lib import children
from tests.helpers import ROOT, database_url, free_port, wait_for

WEB_SERVERS = {
    "uvicorn": lambda port: [
        "-m",
        "uvicorn",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--no-access-log",
        "--log-level",
        "warning",
        "openrelay.asgi:application",
    ],
    "daphne": lambda port: ["-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "openrelay.asgi:application"],
}


def product_env(data_dir, **env):
    """The environment of a product process: the test database, the data dir, two q2 workers,
    the tests' 127.0.0.1 servers allowed as user URLs; then `env`."""
    merged = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "OPENRELAY_DATA_DIR": str(data_dir),
        "OPENRELAY_Q_WORKERS": "2",
        "OPENRELAY_ALLOW_PRIVATE_URLS": "true",
        **{name: str(value) for name, value in env.items()},
    }
    # A browser test sets it for its own ORM calls under Playwright's loop; the product never runs with it.
    merged.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    return merged


class Process:
    """`python argv...` in its own session, its output in `<data_dir>/<name>-<n>.log`.

    `popen` (also `process`) is the subprocess.Popen; `log` the open log file (`log.name` is its path).
    """

    def __init__(self, name, argv, data_dir, env):
        data_dir = Path(data_dir)
        data_dir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.log = open(data_dir / f"{name}-{time.monotonic_ns()}.log", "wb")
        self.popen = children.popen(
            [sys.executable, *argv],
            cwd=ROOT,
            env=env,
            start_new_session=True,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.url = None  # a web server's, once it listens

    @property
    def process(self):
        return self.popen

    @property
    def pid(self):
        return self.popen.pid

    @property
    def log_path(self):
        return Path(self.log.name)

    def log_tail(self, size=3000):
        self.log.flush()
        return self.log_path.read_bytes()[-size:].decode(errors="replace")

    def alive(self):
        """Asserts the child still runs (quoting its log if not); True."""
        assert self.popen.poll() is None, (
            f"{self.name} exited ({self.popen.returncode}); its log ends:\n{self.log_tail()}"
        )
        return True

    def listens(self, port):
        """True once something accepts on 127.0.0.1:`port`; fails if this child exited first."""
        self.alive()
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            return False

    def processes(self):
        """The child and everything it forked, now (psutil): a cluster's sentinel and workers."""
        main = psutil.Process(self.popen.pid)
        return [main, *main.children(recursive=True)]

    def kill(self):
        """kill -9 of the child and every process of its group."""
        os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(timeout=10)

    def terminate(self, timeout=60):
        """SIGTERM to the child alone (what docker and Kubernetes send); wait for it to exit."""
        self.popen.send_signal(signal.SIGTERM)
        self.popen.wait(timeout=timeout)

    def terminate_group(self, times=1, timeout=60):
        """SIGTERM to every process of the group at once, `times` times (systemd's default
        KillMode, `kill -TERM -- -<pgid>`); wait for the child to exit and every process to be gone."""
        processes = self.processes()
        for _ in range(times):
            os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.name} still running {timeout} s after SIGTERM; its log ends:\n{self.log_tail()}")
        psutil.wait_procs(processes, timeout=10)
        assert not still_running(processes), self.log_tail()

    def stop(self):
        """Kills the group (the child, or a worker it left behind) and closes the log; idempotent."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(timeout=10)
        self.log.close()


def still_running(processes):
    """Those of `processes` (psutil) still running: gone or a zombie is not."""

    def running(process):
        try:
            return process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    return [process for process in processes if running(process)]


def start(name, argv, data_dir, **env):
    """`python argv...` with the product's environment (plus `env`)."""
    return Process(name, argv, data_dir, product_env(data_dir, **env))


def cluster(data_dir, **env):
    """`manage.py qcluster`: every worker process runs an engine, on the test database."""
    return start("qcluster", ["manage.py", "qcluster"], data_dir, **env)


def web(kind, data_dir, timeout=30, **env):
    """An ASGI server of the app (`uvicorn` or `daphne`), as the README's production notes run it,
    on a free port; returned once it listens, with its `url`."""
    port = free_port()
    process = start(kind, WEB_SERVERS[kind](port), data_dir, **env)
    try:
        wait_for(lambda: process.listens(port), timeout, f"{kind} to listen")
    except BaseException:
        process.stop()
        raise
    process.url = f"http://127.0.0.1:{port}"
    return process


def clear_broker():
    """Drops the q2 queue in Redis (none on SQLite: the ORM broker's tasks go with the test's tables):
    tasks other tests enqueued with no worker running would otherwise run first."""
    from django.conf import settings

    if settings.REDIS_URL:
        import redis
        from django_q.conf import Conf

        redis.Redis.from_url(settings.REDIS_URL).delete(f"django_q:{Conf.PREFIX}:q")


class Processes:
    """The product processes of one test (or one module), on one data dir, all stopped by `stop()`."""

    def __init__(self, data_dir, **env):
        self.data_dir = Path(data_dir)
        self.env = env
        self.started = []

    def start(self, name, argv, **env):
        self.started.append(start(name, argv, self.data_dir, **{**self.env, **env}))
        return self.started[-1]

    def web(self, kind="uvicorn", **env):
        """Starts a web server; its URL."""
        self.started.append(web(kind, self.data_dir, **{**self.env, **env}))
        return self.started[-1].url

    def cluster(self, **env):
        self.started.append(cluster(self.data_dir, **{**self.env, **env}))
        return self.started[-1]

    workers = cluster

    def stop(self):
        for process in self.started:
            process.stop()
