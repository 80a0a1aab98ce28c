"""A cancel honoured by every engine: no model call of a cancelled batch leaves once the cancel answered.

Found across hosts (tests/hosts): the engine that closes a batch cut its unfinished records at once, but
every other engine learnt of the cancel at its next poll, and until then sent the records it had claimed
ahead (4-12 calls after the cancel's answer with four engines, tests/engine_tests/test_cancel_fence.py).
A push to the engines would narrow that window, not close it (a message can always be late), so the
guarantee is a clock one, as the leases' is (batches.engine.leases):

- Each poll (runner.Engine._poll) notes when its read of the running batches was sent, on the database
  thread just before the query (`read`), once the roster has stopped the batches it found cancelling
  (their calls in flight and waiting are cut, their claimed records forgotten).
- A call goes out only while the last such read is younger than `window_s` (`fresh`), half of
  lifecycle.CANCEL_FENCE_S (calls.caller.ModelCaller checks it after the gate, just before it sends);
  an older one makes the call wait for the next poll, holding its slot.
- A cancel answers CANCEL_FENCE_S after its commit (batches.services.cancel_batch).

A read that found the batch running was sent before the cancel committed, so every call it lets out
leaves within `window_s` of the commit, before the cancel answers; the other half is the margin for a
call's last steps to the wire and for clocks that run at different rates. No clock is compared across
hosts. Nothing here asks the database: `fresh` is a clock check.
"""

import asyncio
import math
import time
from collections.abc import Callable

from batches import lifecycle

WINDOW_S = lifecycle.CANCEL_FENCE_S / 2


class StatusFence:
    """When this engine last read the running batches, and the calls waiting for a newer read."""

    def __init__(
        self, ask_poll: Callable[[], None], window_s: float = WINDOW_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ask_poll = ask_poll  # poll at the loop's next turn (runner.Engine._poll_soon)
        self.window_s = window_s
        self.clock = clock
        self.read_at = -math.inf  # when the last read whose batches the roster has acted on was sent
        self._next: asyncio.Event | None = None  # set by the next read (made in the loop that waits on it)

    def fresh(self) -> bool:
        return self.clock() - self.read_at < self.window_s

    def read(self, sent_at: float) -> None:
        """A poll's read, sent at `sent_at`, is acted on: the calls waiting for it may go."""
        self.read_at = max(self.read_at, sent_at)
        if self._next is not None:
            self._next.set()
            self._next = None

    async def wait_fresh(self) -> None:
        """Until a read younger than the window (a poll is asked for at once)."""
        while not self.fresh():
            if self._next is None:
                self._next = asyncio.Event()
            waiting = self._next
            self.ask_poll()
            await waiting.wait()
