"""The engine's byte budget for model answers it holds: read, parsed, waiting for a flush.

The answer cap (OPENRELAY_MAX_MODEL_RESPONSE_BYTES) bounds one answer; this
bounds their sum in one engine. Measured before it (issue 42): 16 embeddings
answers of 2,048 x 3,072 (~130 MB each, under the cap) held at once pushed
two workers to 7.8 and 6.8 GB, since a parsed answer costs 2-3 times its
bytes and its JSON text is made again for the flush.

An answer that announces its length (Content-Length) over SMALL_BYTES takes
its bytes before its body is read; when they would pass the budget, the
connection stops reading (the server's bytes wait in its socket) until
flushed answers give room back. One answer larger than the whole budget
goes when nothing else is held, so nothing waits forever. Smaller answers,
and answers without a length (chunked), are counted but never wait: another
organization's ordinary answers go through while big ones queue. A record's
bytes are held until its outcome is flushed (Holding.release, by the engine).

An answer that waits for room has been answered: the server's work is done and its bytes wait
in its socket. Its call gives its slot at the gate back then (`waits`, set by
calls.caller.ModelCaller.call for each attempt), and the wait is not taken for the server's
latency. Held to the end of the call, the slots went to answers waiting for a big flush to land
(a minute on the loaded machine), flow control took the wait for a queue in the server and cut
the deployment's limit towards its floor, and another organization's small calls waited behind
them (issue 55, bench row 15).

Everything runs on the engine's event loop thread: no locks.
"""

from __future__ import annotations

import contextvars
from collections import deque
from collections.abc import Callable

SMALL_BYTES = 1024 * 1024  # answers up to this never wait (they are counted)

# The Holding of the record whose task is running: the transport takes answer bytes into it.
current: contextvars.ContextVar[Holding | None] = contextvars.ContextVar("answer_holding", default=None)
# The call in flight's: the transport calls it when the call's answer begins to wait for room.
waits: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar("answer_waits", default=None)


class Budget:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.peak = 0
        self.waited = 0  # answers that waited for room (a figure for tests and logs)
        self._waiting: deque[tuple[int, Callable[[], None]]] = deque()

    @property
    def waiting(self) -> bool:
        return bool(self._waiting)

    def take(self, size: int, granted: Callable[[], None]) -> bool:
        """Take `size` bytes now (True), or queue and call `granted` once they are taken (False)."""
        if not self._waiting and self._fits(size):
            self._add(size)
            return True
        self.waited += 1
        self._waiting.append((size, granted))
        return False

    def force(self, size: int) -> None:
        """Count bytes that are held already (a small or chunked answer, an inflated one)."""
        self._add(size)

    def cancel(self, granted: Callable[[], None]) -> None:
        """Forget a queued take (its connection failed while it waited)."""
        self._waiting = deque(item for item in self._waiting if item[1] is not granted)
        self._grant()

    def give_back(self, size: int) -> None:
        self.held -= size
        self._grant()

    def _fits(self, size: int) -> bool:
        return self.held + size <= self.limit or self.held == 0

    def _add(self, size: int) -> None:
        self.held += size
        self.peak = max(self.peak, self.held)

    def _grant(self) -> None:
        # In order: a big answer at the head is not passed by later ones forever.
        while self._waiting and self._fits(self._waiting[0][0]):
            size, granted = self._waiting.popleft()
            self._add(size)
            granted()


class Holding:
    """The answer bytes one record holds until its outcome is flushed."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.size = 0
        self.released = False  # flushed: a call its record's context still makes (a probe) takes nothing

    def take(self, size: int, granted: Callable[[], None]) -> Callable[[], None] | None:
        """Take `size` bytes now (None) or once there is room: then `granted` is called, and
        what this returns cancels the wait (Budget.cancel)."""

        def on_room() -> None:
            self.size += size
            granted()

        if self.released:
            return None
        if self.budget.take(size, on_room):
            self.size += size
            return None
        return on_room

    def force(self, size: int) -> None:
        if size < 0:
            self.give_back(-size)
        elif size and not self.released:
            self.size += size
            self.budget.force(size)

    def give_back(self, size: int) -> None:
        size = min(size, self.size)
        self.size -= size
        self.budget.give_back(size)

    def release(self) -> None:
        self.released = True
        if self.size:
            self.give_back(self.size)
