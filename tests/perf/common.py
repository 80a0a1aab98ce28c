"""Small helpers the benchmarks share."""

import os
import secrets
import tempfile
import threading
import time

import httpx
import psutil

MB = 2**20


class Sampler:
    """Calls `sample()` at entry, every `every_s` in a daemon thread while the `with` block runs, and
    at exit: what the benchmarks watch beside a run (a process's memory, a server's line)."""

    def __init__(self, every_s):
        self.every_s = every_s

    def sample(self):
        raise NotImplementedError

    def __enter__(self):
        self._stop = threading.Event()
        self.sample()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _loop(self):
        while not self._stop.wait(self.every_s):
            self.sample()

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.sample()


class PeakRss(Sampler):
    """A process's peak RSS (this one by default); `growth_mb` is the peak minus the RSS at entry. A
    process that exits keeps the peak it reached."""

    def __init__(self, pid=None, every_s=0.01):
        super().__init__(every_s)
        self.process = psutil.Process(pid)
        self.start = self.peak = self.process.memory_info().rss

    def __enter__(self):
        self.start = self.peak = self.process.memory_info().rss
        return super().__enter__()

    def sample(self):
        try:
            self.peak = max(self.peak, self.process.memory_info().rss)
        except psutil.Error:
            pass

    @property
    def growth_mb(self):
        return (self.peak - self.start) / MB


class PeakTreeRss(Sampler):
    """The RSS of a process tree: per-process peaks (`peaks`) and the growth of the largest."""

    def __init__(self, pid, every_s=0.01):
        super().__init__(every_s)
        self.root = psutil.Process(pid)
        self.peaks = {}

    def _tree(self):
        try:
            return [self.root, *self.root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def sample(self):
        for process in self._tree():
            try:
                rss = process.memory_info().rss
            except psutil.Error:
                continue
            self.peaks[process.pid] = max(self.peaks.get(process.pid, 0), rss)

    def __enter__(self):
        self.start = self.root.memory_info().rss
        return super().__enter__()

    @property
    def growth_mb(self):
        return (self.peaks.get(self.root.pid, self.start) - self.start) / MB

    @property
    def largest_mb(self):
        return max(self.peaks.values(), default=0) / MB


def wait_http(process, url, deadline_s=60):
    """Wait until `url` answers, failing fast if the server process exits."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url}: the server exited with {process.returncode}")
        try:
            httpx.get(url, timeout=2)
            return
        except httpx.TransportError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer in time")


def django_in_throwaway_database(database_url, prefix):
    """Set Django up on a database of its own, migrated: a new PostgreSQL database on `database_url`'s server,
    or a temp SQLite file when it is None. Returns a function that drops the PostgreSQL one (None for SQLite)."""
    os.environ.setdefault("OPENRELAY_DATA_DIR", tempfile.mkdtemp(prefix=f"{prefix}-"))
    os.environ.setdefault("OPENRELAY_LOG_LEVEL", "WARNING")
    dropper = None
    if database_url:
        import psycopg

        name = f"{prefix}_" + secrets.token_hex(4)
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        os.environ["DATABASE_URL"] = database_url.rsplit("/", 1)[0] + "/" + name

        def dropper():
            from django.db import connections

            connections.close_all()
            with psycopg.connect(database_url, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "openrelay.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", "--noinput", verbosity=0)
    return dropper
