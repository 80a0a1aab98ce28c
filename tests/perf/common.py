"""Small helpers the benchmarks share."""

import os
import secrets
import tempfile
import threading
import time

import httpx
import psutil

MB = 2**20


class PeakRss:
    """Samples a process's RSS in a thread (this one by default); `growth_mb` is the peak minus the RSS at entry."""

    def __init__(self, pid=None, every_s=0.01):
        self.process = psutil.Process(pid)
        self.every_s = every_s

    def __enter__(self):
        self.start = self.peak = self.process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(self.every_s):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)

    @property
    def growth_mb(self):
        return (self.peak - self.start) / MB


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
