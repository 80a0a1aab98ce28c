"""Parallel runs with pytest-xdist (`-n 3 --dist loadgroup --no-loadscope-reorder`, as .ci/run runs).

A pass of the suite keeps one core of the 2-core machine busy about half the time: most tests wait
on processes they started (clusters, servers, Chromium) or on a scenario's own clock (the 90 s
outage). Three workers overlap those waits (docs/guides/testing.md has the figures). What that needs:

- Each worker its own data folder (storage, logs, SQLite test database) and its own Redis
  database: a cluster one worker starts must never take the q2 tasks, channel-layer messages or
  cache keys of the other's. Set here at import, before pytest-django imports the settings (this
  plugin is loaded with `-p`, after tests.dataroot).
- Work units that keep what is shared inside one worker: a test module's tests go to one worker
  together (its module-scoped servers and clusters start once), and so do all the tests of the
  shared running product (`live_stack`), across modules.
- The longest units first, so no worker ends the run alone: tests marked `long`, then the
  modules with the most `slow` tests; the units holding an `exclusive` test last, so that test
  waits for short tests of the other workers, not for long ones.
- Tests marked `exclusive` (they restart PostgreSQL or Redis, which every worker uses, or measure by
  the clock what another worker's load skews) run with no test beside them: every test holds a
  shared lock, an exclusive test waits for the other workers' tests to end and holds the lock
  alone. After one ran, the other workers drop their database connections, which a restart broke.

Without xdist (`pytest` alone, README's command) none of this applies.
"""

import fcntl
import os
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

WORKER = os.environ.get("PYTEST_XDIST_WORKER")  # "gw0", "gw1", ... in an xdist worker, else None


def _redis_url_of_worker(url, index):
    """The URL's database number plus the worker's index: gw0 keeps it, gw1 the next one."""
    parts = urlsplit(url)
    database = int(parts.path.strip("/") or 0) + index
    return urlunsplit(parts._replace(path=f"/{database}"))


_shared_dir = None
if WORKER:
    _index = int(WORKER.removeprefix("gw"))
    _shared_dir = Path(os.environ["OPENRELAY_DATA_DIR"])  # tests.dataroot made or was given it
    _own = _shared_dir / WORKER
    _own.mkdir(parents=True, exist_ok=True)
    os.environ["OPENRELAY_DATA_DIR"] = str(_own)
    if os.environ.get("REDIS_URL"):
        os.environ["REDIS_URL"] = _redis_url_of_worker(os.environ["REDIS_URL"], _index)


def _scope(item):
    """The work unit an item goes in: the shared running product's, else its module's."""
    if "live_stack" in getattr(item, "fixturenames", ()):
        return "live_stack"
    return item.nodeid.split("::", 1)[0]


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook turns the group into the node id's suffix
def pytest_collection_modifyitems(config, items):
    if not WORKER:
        return
    scopes, scope_of = {}, {}
    for item in items:
        name = scope_of[item.nodeid] = _scope(item)
        scope = scopes.setdefault(name, {"long": False, "exclusive": False, "slow": 0, "first": len(scopes)})
        scope["long"] |= item.get_closest_marker("long") is not None
        scope["exclusive"] |= item.get_closest_marker("exclusive") is not None
        scope["slow"] += item.get_closest_marker("slow") is not None
        if not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(name))

    def rank(item):
        scope = scopes[scope_of[item.nodeid]]
        return (not scope["long"], scope["exclusive"], -scope["slow"], scope["first"])

    items.sort(key=rank)  # stable: a unit's tests keep their order


class _WorkerLock:
    """A readers-writer lock between the workers of one run, on two files (flock).

    The gate makes it fair: an exclusive test waiting for the lock holds the gate, so the other
    workers cannot take the shared lock again and again before it.
    """

    def __init__(self, folder):
        self.lock = open(folder / "workers.lock", "a+")
        self.gate = open(folder / "workers.gate", "a+")
        self.generation = folder / "workers.exclusive-runs"
        self.seen = self._generation()

    def _generation(self):
        try:
            return int(self.generation.read_text() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def acquire(self, exclusive):
        fcntl.flock(self.gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(self.lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(self.gate, fcntl.LOCK_UN)
        generation = self._generation()
        if generation != self.seen:
            self.seen = generation
            self._after_a_restart()

    def release(self, exclusive):
        if exclusive:
            self.seen = self._generation() + 1
            self.generation.write_text(str(self.seen))
        fcntl.flock(self.lock, fcntl.LOCK_UN)

    @staticmethod
    def _after_a_restart():
        from django.db import connections

        connections.close_all()  # their server may have restarted under them


_lock = _WorkerLock(_shared_dir) if WORKER else None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if _lock is None:
        yield
        return
    exclusive = item.get_closest_marker("exclusive") is not None
    _lock.acquire(exclusive)
    try:
        yield
    finally:
        _lock.release(exclusive)
