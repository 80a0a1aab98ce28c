"""Checkpoints: a multi-step record's loop state, stored under its lease so a resumed run
continues where the last one stopped.

A tool loop checkpoints after every model turn that asks for tools and after
every executor (or MCP) answer; a workflow after every request of a step and
after every callback answer. The state is orjson (zlib once it is over
COMPRESS_OVER bytes) in Record.checkpoint, written by a conditional UPDATE
(still our lease, still running), cleared by the flush that stores the
record's outcome. A record claimed with a checkpoint (its worker died, or
handed it back on SIGTERM) starts from it: finished turns, rounds and steps
are not sent again; at most the step in flight at the crash repeats.

Writes are group-committed: every record's checkpoint waiting when the
database thread is free goes in one statement, and a record's newer state
replaces an older one still waiting (a workflow step's concurrent requests
checkpoint one after another). A record waits for its own write before it
goes on, so nothing it does next is lost to a crash after it.
"""

import asyncio
import hashlib
import zlib

import orjson

from batches.engine import store
from batches.engine.calls.usage import Usage

COMPRESS_OVER = 2048
_ZLIB = b"z"  # orjson output of a dict starts with "{": anything else is tagged


class LeaseLost(Exception):
    """The record is no longer ours (its lease ran out and another engine took it, or its
    batch was cancelled or expired): stop working it; its outcome would be skipped anyway."""


def encode(state):
    data = orjson.dumps(state)
    if len(data) > COMPRESS_OVER:
        data = _ZLIB + zlib.compress(data, 1)
    return data


def decode(data):
    if data is None:
        return None
    data = bytes(data)
    if data[:1] == _ZLIB:
        data = zlib.decompress(data[1:])
    return orjson.loads(data)


def usage_state(usage):
    return [
        usage.prompt_tokens,
        usage.cached_tokens,
        usage.completion_tokens,
        usage.reasoning_tokens,
        usage.implausible,
    ]


def usage_from(state):
    return Usage(*state) if state else Usage()


def idempotency_key(text: str) -> str:
    """The Idempotency-Key header value: the first 32 hex digits of sha256(text), where
    text names the record and its round, tool call or step (docs/guides/tool-calling.md)."""
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class CheckpointWriter:
    """One engine's checkpoint writes, through its database thread."""

    def __init__(self, engine):
        self.engine = engine
        self.waiting = {}  # record pk -> [encoded state, futures of the records waiting for it]
        self.task = None
        self.written = 0  # checkpoints written, and their bytes (the perf script reads these)
        self.bytes = 0

    async def save(self, pk, data):
        future = asyncio.get_running_loop().create_future()
        entry = self.waiting.get(pk)
        if entry is None:
            self.waiting[pk] = [data, [future]]
        else:
            entry[0] = data
            entry[1].append(future)
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._drain())
        if not await future:
            raise LeaseLost

    async def _drain(self):
        try:
            while self.waiting:
                batch, self.waiting = self.waiting, {}
                try:
                    held = await self.engine.db(
                        store.save_checkpoints, self.engine.owner, {pk: data for pk, (data, _) in batch.items()}
                    )
                except Exception as exc:  # noqa: BLE001 - every waiter of the group gets the error; the writer goes on
                    _settle(batch, exc=exc)
                    continue
                self.written += len(batch)
                self.bytes += sum(len(data) for data, _ in batch.values())
                _settle(batch, held=held)
        finally:
            self.task = None


def _settle(batch, held=(), exc=None):
    for pk, (_, futures) in batch.items():
        for future in futures:
            if future.done():
                continue  # its record was cancelled meanwhile
            if exc is not None:
                future.set_exception(exc)
            else:
                future.set_result(pk in held)
