"""The capacity model: slots, a queue, a prefix cache.

On while `slots` > 0: N slots with a FIFO queue before them and its limit
(`Overloaded`, answered 503), prefill and decode costs per token, the prefix
cache of chained 64-character blocks (`PrefixCache`) and the text of each body
it reads, the live figures `/_sim/stats` and `/metrics` report, and
`capacity_per_second`, the most requests a second of one shape the server
finishes.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import Any

from openrelay.simulator.bodies import chat_messages, completion_prompts, message_text, response_inputs
from openrelay.simulator.config import SimulatorConfig

BLOCK_TOKENS = 16  # vLLM's default KV block size
BLOCK_CHARS = 4 * BLOCK_TOKENS


class Overloaded(Exception):
    """The queue is full: answered 503 at once."""

    def __init__(self, waiting: int):
        super().__init__(f"The server is overloaded: {waiting} requests are waiting.")


def capacity_per_second(
    config: SimulatorConfig, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0
) -> float:
    """The most requests a second of this shape the server finishes, all N slots busy.

    Each request holds a slot for
        prefill_ms_per_token * (prompt_tokens - cached_tokens)
        + completion_tokens * decode_ms_per_token * (1 + decode_contention * (N - 1) / N)
    milliseconds, so N slots finish N * 1000 / that many a second. Time spent
    queued does not count (nothing runs then) and neither does `latency_ms`,
    which the server waits before a request queues. Infinite without a
    capacity model (slots 0) or when a request costs no time.
    """
    if config.slots <= 0:
        return math.inf
    slot_ms = prefill_ms(config, prompt_tokens - cached_tokens) + completion_tokens * decode_ms_per_token(
        config, config.slots
    )
    return math.inf if slot_ms <= 0 else config.slots * 1000 / slot_ms


def prefill_ms(config: SimulatorConfig, uncached_tokens: int) -> float:
    return config.prefill_ms_per_token * max(0, uncached_tokens)


def decode_ms_per_token(config: SimulatorConfig, busy: int) -> float:
    """One output token's time with `busy` slots held (continuous batching slows each a little)."""
    return config.decode_ms_per_token * (1 + config.decode_contention * (busy - 1) / config.slots)


def chat_prefix_text(body: dict[str, Any]) -> str:
    """What the prefix cache sees of a chat: each message's role and text, in order."""
    return "".join(f"{m.get('role')}\n{message_text(m)}\n" for m in chat_messages(body) if isinstance(m, dict))


def completion_prefix_text(body: dict[str, Any]) -> str:
    return "\n".join(p if isinstance(p, str) else ",".join(map(str, p)) for p in completion_prompts(body))


def response_prefix_text(body: dict[str, Any]) -> str:
    instructions = body.get("instructions")
    text = f"instructions\n{instructions}\n" if isinstance(instructions, str) else ""
    return text + "".join(f"{item.get('role', 'user')}\n{message_text(item)}\n" for item in response_inputs(body))


def prefix_blocks(text: str, max_blocks: int) -> list[int]:
    """Keys of the text's whole 64-character blocks, each chained over all before it.

    Like vLLM's block hashes: equal keys mean equal text up to and including
    that block. Python's hash() is enough (the cache lives in one process):
    32 blocks (a 2,000-character prompt) cost 10 µs.
    """
    keys, key = [], 0
    for start in range(0, min(len(text) // BLOCK_CHARS, max_blocks) * BLOCK_CHARS, BLOCK_CHARS):
        key = hash((key, text[start : start + BLOCK_CHARS]))
        keys.append(key)
    return keys


class PrefixCache:
    """Blocks of recently prefilled prompts, least recently used evicted first.

    Not locked: the capacity model holds its lock around every call.
    """

    def __init__(self, capacity_tokens: int):
        self.capacity_blocks = capacity_tokens // BLOCK_TOKENS
        self._blocks: OrderedDict[int, None] = OrderedDict()

    @property
    def used_tokens(self) -> int:
        return len(self._blocks) * BLOCK_TOKENS

    def cached_tokens(self, keys: Sequence[int]) -> int:
        """Tokens of the request's leading blocks found in the cache."""
        found = 0
        for key in keys:
            if key not in self._blocks:
                break
            found += 1
        return found * BLOCK_TOKENS

    def insert(self, keys: Sequence[int]) -> None:
        # Tail first, so the shared head of a prompt is the most recently
        # used and a request's tail is evicted before its head (as vLLM
        # frees a request's blocks).
        for key in reversed(keys):
            if key in self._blocks:
                self._blocks.move_to_end(key)
            else:
                self._blocks[key] = None
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)

    def clear(self) -> None:
        self._blocks.clear()


class CapacityModel:
    """N slots, a FIFO queue before them, a prefix cache, and the figures of all three.

    Requests run on the server's event loop; tests and /_sim/stats read the
    figures from any thread, so every change holds the lock (five uncontended
    rounds a request). A request costs at most two timers (prefill, decode)
    beyond a plain answer.
    """

    def __init__(self, config: SimulatorConfig):
        self.config = config
        self.prefix_cache = PrefixCache(config.prefix_cache_tokens)
        self.running = 0
        self.waiting = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._lock = threading.Lock()
        self._clear_figures()

    async def serve(self, prompt_tokens: int, completion_tokens: int, keys: list[int] | None) -> int:
        """Hold a slot for the request's prefill and decode; return its cached tokens.

        `keys` are the prompt's block keys, None when the prefix cache does
        not look at this request. Raises Overloaded when the queue is full.
        """
        await self._take_slot()
        try:
            with self._lock:
                cached = self.prefix_cache.cached_tokens(keys or ())
            await _pause(prefill_ms(self.config, prompt_tokens - cached))
            with self._lock:
                self.prefix_cache.insert(keys or ())
                busy = self.running
            await _pause(completion_tokens * decode_ms_per_token(self.config, busy))
        finally:
            self._give_slot_back()
        self._count(prompt_tokens, cached, completion_tokens, queried=0 if keys is None else prompt_tokens)
        return cached

    def stats(self) -> dict[str, Any]:
        with self._lock:
            self._add_busy_time()
            return {
                "slots": self.config.slots,
                "queue_limit": self.config.queue_limit,
                "completed": self.completed,
                "rejected": self.rejected,
                "running": self.running,
                "waiting": self.waiting,
                "max_running": self.max_running,
                "max_waiting": self.max_waiting,
                "busy_slot_seconds": self.busy_slot_seconds,
                "prompt_tokens": self.prompt_tokens,
                "cached_tokens": self.cached_tokens,
                "completion_tokens": self.completion_tokens,
                "prefix_cache_queries": self.prefix_cache_queries,
                "prefix_cache_used_tokens": self.prefix_cache.used_tokens,
            }

    def reset(self) -> None:
        """Zero the figures and empty the prefix cache; requests in flight carry on."""
        with self._lock:
            self._clear_figures()
            self.prefix_cache.clear()

    def _clear_figures(self) -> None:
        self.completed = self.rejected = 0
        self.prompt_tokens = self.cached_tokens = self.completion_tokens = 0
        self.prefix_cache_queries = 0
        self.max_running, self.max_waiting = self.running, self.waiting
        self.busy_slot_seconds = 0.0
        self._busy_since = time.monotonic()

    async def _take_slot(self) -> None:
        with self._lock:
            # While a slot is free nobody waits (a freed slot goes straight
            # to the first live waiter), so taking it keeps the queue FIFO.
            if self.running < self.config.slots:
                self._set_running(self.running + 1)
                return
            limit = self.config.queue_limit
            if limit is not None and self.waiting >= limit:
                self.rejected += 1
                raise Overloaded(self.waiting)
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            self.waiting += 1
            self.max_waiting = max(self.max_waiting, self.waiting)
        try:
            await waiter
        except asyncio.CancelledError:
            self._leave_queue(waiter)
            raise

    def _leave_queue(self, waiter: asyncio.Future[None]) -> None:
        if waiter.done() and not waiter.cancelled():
            # Handed a slot just as the caller went away: pass it on.
            self._give_slot_back()
            return
        with self._lock:
            self.waiting -= 1
            try:
                self._waiters.remove(waiter)
            except ValueError:  # already skipped by _give_slot_back
                pass

    def _give_slot_back(self) -> None:
        with self._lock:
            while self._waiters:
                waiter = self._waiters.popleft()
                if not waiter.done():  # a cancelled waiter counts itself out
                    waiter.set_result(None)
                    self.waiting -= 1
                    return
            self._set_running(self.running - 1)

    def _set_running(self, running: int) -> None:
        self._add_busy_time()
        self.running = running
        self.max_running = max(self.max_running, running)

    def _add_busy_time(self) -> None:
        now = time.monotonic()
        self.busy_slot_seconds += self.running * (now - self._busy_since)
        self._busy_since = now

    def _count(self, prompt_tokens: int, cached: int, completion_tokens: int, queried: int) -> None:
        with self._lock:
            self.completed += 1
            self.prompt_tokens += prompt_tokens
            self.cached_tokens += cached
            self.completion_tokens += completion_tokens
            self.prefix_cache_queries += queried


async def _pause(milliseconds: float) -> None:
    if milliseconds > 0:
        await asyncio.sleep(milliseconds / 1000)


def usage_counts(payload: dict[str, Any]) -> tuple[int | None, int]:
    """(prompt, completion) tokens of an answer's usage; (None, 0) without usage."""
    usage = payload.get("usage")
    if not isinstance(usage, dict):
        return None, 0
    if "cache_read_input_tokens" in usage:  # an Anthropic Message: its input_tokens leave the cache out
        return usage["input_tokens"] + usage["cache_read_input_tokens"], usage["output_tokens"]
    if "input_tokens" in usage:
        return usage["input_tokens"], usage["output_tokens"]
    return usage["prompt_tokens"], usage.get("completion_tokens", 0)


def report_cached_tokens(payload: dict[str, Any], cached: int) -> None:
    usage = payload.get("usage") or {}
    if "cache_read_input_tokens" in usage:
        prompt = usage["input_tokens"] + usage["cache_read_input_tokens"]
        usage["cache_read_input_tokens"], usage["input_tokens"] = cached, prompt - cached
        return
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details")
    if details is not None:
        details["cached_tokens"] = cached
