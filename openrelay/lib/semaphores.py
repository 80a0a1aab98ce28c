"""Counting semaphores shared by every process of the deployment: at most `limit` holders of a name.

`shared(name, limit, lease_s)` picks the backend where the processes meet:
- with REDIS_URL set (production: several web processes, several hosts), a Redis sorted set of
  holders, each scored by the end of its lease. Taking a slot drops the expired holders and adds
  one if fewer than `limit` remain, in one script (atomic, on Redis's own clock, so hosts' clocks
  don't matter). A process that dies holding a slot frees it when its lease ends;
- without Redis (the embedded default: SQLite, one host), `limit` lock files under
  OPENRELAY_DATA_DIR/semaphores/<name>/, a slot an exclusive flock on one of them. The kernel drops
  a process's flocks when it dies, so nothing leaks and no lease is needed.

Neither backend queues across processes: a waiter tries again every few milliseconds until its
deadline. Inside a process only one thread a name tries at a time (the others wait for their turn
on a local lock, so 48 quotes' 192 waiting threads are 2 pollers, not 192), and a slot released in
the process wakes it at once: 400 calls of 5 ms from 32 threads under a limit of 4 took 0.61 s, the
slots busy 95% of the time (0.58 s at best).

Why not a library (docs/decisions/shared-semaphores.md): portalocker's BoundedSemaphore is these
lock files, but its Redis lock is a mutex (one holder, a pub/sub thread each), and we need both
backends behind one interface with the same waits; redis-py has locks, not semaphores.
"""

import fcntl
import functools
import logging
import os
import random
import threading
import time
import uuid
from pathlib import Path

from django.conf import settings

logger = logging.getLogger("openrelay.semaphores")

FIRST_WAIT_S = 0.001
LONGEST_WAIT_S = 0.01  # one thread a process tries: 2 processes at most 200 tries a second each

# KEYS[1]: the holders (token -> lease end, ms); ARGV: limit, lease ms, token. 1 when the token now holds a slot.
_TAKE = """
local now = redis.call('TIME')
local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then
  return 0
end
redis.call('ZADD', KEYS[1], now_ms + tonumber(ARGV[2]), ARGV[3])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
return 1
"""


class Unavailable(Exception):
    """The backend can't be asked (Redis is down, the data dir unwritable)."""


def shared(name, limit, *, lease_s):
    """The semaphore `name` of at most `limit` holders (at least 1) across processes; a holder that
    never releases (its process died) is dropped after `lease_s` (Redis; file locks need no lease)."""
    limit = max(1, int(limit))
    if settings.REDIS_URL:
        return RedisSemaphore(name, limit, lease_s)
    return FileSemaphore(name, limit)


class _Local:
    """A name's waiters in this process: whose turn it is to try, and a wake-up when a slot is freed here."""

    def __init__(self):
        self.turn = threading.Lock()
        self.freed = threading.Event()


_locals: dict[str, _Local] = {}
_locals_lock = threading.Lock()


def _local(name):
    with _locals_lock:
        return _locals.setdefault(name, _Local())


class Semaphore:
    def __init__(self, name, limit):
        self.limit = limit
        self.local = _local(name)

    def acquire(self, wait_s):
        """A held slot (release it), or None if none came free within `wait_s` seconds."""
        deadline = time.monotonic() + max(0.0, wait_s)
        if not self.local.turn.acquire(timeout=max(0.0, wait_s)):
            return None
        try:
            return self._wait(deadline)
        finally:
            self.local.turn.release()

    def _wait(self, deadline):
        pause = FIRST_WAIT_S
        while True:
            self.local.freed.clear()  # before trying: a release from now on wakes the wait below
            slot = self._try()
            if slot is not None:
                return _Released(slot, self.local.freed)
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            # Jittered so that processes which failed together don't all try again together.
            self.local.freed.wait(min(left, pause * random.uniform(0.5, 1.5)))
            pause = min(LONGEST_WAIT_S, pause * 2)

    def _try(self):
        raise NotImplementedError


class _Released:
    """A held slot whose release wakes this process's next waiter."""

    def __init__(self, slot, freed):
        self.slot, self.freed = slot, freed

    def release(self):
        self.slot.release()
        self.freed.set()


class RedisSemaphore(Semaphore):
    def __init__(self, name, limit, lease_s):
        super().__init__(name, limit)
        self.key = f"openrelay:semaphore:{name}"
        self.lease_ms = max(1, round(lease_s * 1000))

    def _try(self):
        import redis

        token = uuid.uuid4().hex
        try:
            taken = _take_script()(keys=[self.key], args=[self.limit, self.lease_ms, token])
        except redis.RedisError as exc:
            raise Unavailable(f"Redis: {type(exc).__name__}") from exc
        return RedisSlot(self.key, token) if taken else None


class RedisSlot:
    def __init__(self, key, token):
        self.key, self.token = key, token

    def release(self):
        import redis

        try:
            _redis().zrem(self.key, self.token)
        except redis.RedisError:
            logger.warning("semaphore slot %s not released (its lease frees it)", self.key, exc_info=True)


@functools.cache
def _redis():
    import redis

    return redis.Redis.from_url(settings.REDIS_URL)


@functools.cache
def _take_script():
    return _redis().register_script(_TAKE)


class FileSemaphore(Semaphore):
    def __init__(self, name, limit):
        super().__init__(name, limit)
        self.folder = Path(settings.DATA_DIR) / "semaphores" / name
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise Unavailable(f"{self.folder}: {exc.strerror}") from exc

    def _try(self):
        # From a random slot on, so waiters don't all contend for slot 0 first.
        first = random.randrange(self.limit)
        for i in range(self.limit):
            slot = self._lock((first + i) % self.limit)
            if slot is not None:
                return slot
        return None

    def _lock(self, index):
        # Its own open file each time: flock locks belong to an open file, so two threads of one process
        # exclude each other too (POSIX fcntl/lockf locks would not: they belong to the process).
        try:
            fd = os.open(self.folder / f"slot-{index}", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise Unavailable(f"{self.folder}: {exc.strerror}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return FileSlot(fd)


class FileSlot:
    def __init__(self, fd):
        self.fd = fd

    def release(self):
        if self.fd is not None:
            os.close(self.fd)  # closing the file drops its lock
            self.fd = None
