"""Calls a deployment answered in the last minute, and how many failed: what the operator page shows.

Per-second buckets (60 of them), so counting a call is two additions and
the memory is fixed whatever the rate. A failed call is one that did not
come back 2xx: the server failed under it (connection, 5xx, 401/403), it
passed the time limit, or the model answered 4xx (429 included).
"""

import time

WINDOW_S = 60


class CallCount:
    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self._seconds = [-1] * WINDOW_S  # the second each bucket counts
        self._calls = [0] * WINDOW_S
        self._failed = [0] * WINDOW_S

    def add(self, ok):
        second = int(self._clock())
        i = second % WINDOW_S
        if self._seconds[i] != second:
            self._seconds[i], self._calls[i], self._failed[i] = second, 0, 0
        self._calls[i] += 1
        if not ok:
            self._failed[i] += 1

    def last_minute(self):
        """(calls, failed) of the last WINDOW_S seconds."""
        since = int(self._clock()) - WINDOW_S
        calls = failed = 0
        for second, n, bad in zip(self._seconds, self._calls, self._failed):
            if second > since:
                calls += n
                failed += bad
        return calls, failed
