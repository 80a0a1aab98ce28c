"""Calls a deployment answered in the last minute, and how many failed: what the operator page shows.

Per-second buckets (60 of them), so counting a call is two additions and
the memory is fixed whatever the rate. A failed call is one the deployment
failed (`deployment_failed`): no answer (connection), 5xx, 401/403 (its key),
or past the time limit. A record's own 4xx (a bad request, 404, 429's back
pressure) is the record's failure, not the deployment's: counted as a call
only, or a deployment answering every user error correctly read "failing".
"""

import time

WINDOW_S = 60


def deployment_failed(answer, status_code):
    """`answer`: batches.tallies.answer_class of the call."""
    return answer in ("failed", "time_limit", "5xx") or status_code in (401, 403)


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
