"""What the server remembers between requests.

The recorded model calls (secret headers left out, only the last
`record_limit` kept) and the per-body counters the repeat directives and the
seeded draw use. Thread-safe, since tests read it from other threads while the
server's loop writes it.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Mapping
from typing import Any

from openrelay.simulator.config import SimulatorConfig

SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "api-key", "x-api-key", "cookie"})
# Per-body counters only need to outlive a batch's retries; the cap keeps a
# long benchmark with error rates from growing memory without bound.
SEEN_BODIES_LIMIT = 200_000


class SimulatorState:
    """What the server remembers: recorded calls and per-body counters.

    Touched by the server's event loop and read by tests from other threads,
    so every access holds the lock.
    """

    def __init__(self, config: SimulatorConfig):
        self.config = config
        self.request_count = 0
        # Model calls by the client's address, and how many are in the server at once (its most since the
        # last reset): a test of many hosts counts a cut host's calls and a limit held across hosts by them.
        self.calls_by_peer: dict[str, int] = {}
        self.in_flight = 0
        self.in_flight_by_peer: dict[str, int] = {}
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._recorded: deque[dict[str, Any]] = deque(maxlen=max(1, config.record_limit))
        self._seen: OrderedDict[bytes, int] = OrderedDict()

    def record(self, path: str, headers: Mapping[str, str], body: Any, peer: str | None = None) -> None:
        """Count the call (and by `peer`, the client's address); keep it (secret headers left out) when recording."""
        with self._lock:
            self.request_count += 1
            if peer is not None:
                self.calls_by_peer[peer] = self.calls_by_peer.get(peer, 0) + 1
            if self.config.record:
                # `at`: when it came (time.monotonic(); tests in the same process time re-sends by it).
                self._recorded.append(
                    {"path": path, "headers": recordable_headers(headers), "body": body, "at": time.monotonic()}
                )

    def entered(self, peer: str | None) -> None:
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            if peer is not None:
                self.in_flight_by_peer[peer] = self.in_flight_by_peer.get(peer, 0) + 1

    def left(self, peer: str | None) -> None:
        with self._lock:
            self.in_flight -= 1
            if peer is not None:
                self.in_flight_by_peer[peer] -= 1

    def calls(self) -> dict[str, Any]:
        """What `GET /_sim/calls` answers: the calls in all and by client address, those in the server now
        (in all and by address) and the most at once."""
        with self._lock:
            return {
                "total": self.request_count,
                "by_peer": dict(self.calls_by_peer),
                "in_flight": self.in_flight,
                "in_flight_by_peer": {peer: n for peer, n in self.in_flight_by_peer.items() if n},
                "max_in_flight": self.max_in_flight,
            }

    def requests(self, path: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            recorded = list(self._recorded)
        return [r for r in recorded if path is None or r["path"] == path]

    def times_seen(self, body_hash: bytes) -> int:
        """How many times this body was seen before; counts this time."""
        with self._lock:
            seen = self._seen.pop(body_hash, 0)
            self._seen[body_hash] = seen + 1
            if len(self._seen) > SEEN_BODIES_LIMIT:
                self._seen.popitem(last=False)
            return seen

    def reset(self) -> None:
        with self._lock:
            self._recorded.clear()
            self._seen.clear()
            self.request_count = 0
            self.calls_by_peer.clear()
            self.max_in_flight = self.in_flight


def recordable_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items() if k.lower() not in SECRET_HEADERS}
