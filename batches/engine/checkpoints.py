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
goes on, so nothing it does next is lost to a crash after it (the writer,
CheckpointWriter, is a database trip: batches.engine.trips).
"""

import hashlib
import zlib
from typing import Any

import orjson

from batches.engine.calls.usage import Usage

COMPRESS_OVER = 2048
_ZLIB = b"z"  # orjson output of a dict starts with "{": anything else is tagged


class LeaseLost(Exception):
    """The record is no longer ours (its lease ran out and another engine took it, or its
    batch was cancelled or expired): stop working it; its outcome would be skipped anyway."""


def encode(state: Any) -> bytes:
    data = orjson.dumps(state)
    if len(data) > COMPRESS_OVER:
        data = _ZLIB + zlib.compress(data, 1)
    return data


def decode(data: bytes | memoryview | None) -> Any:
    if data is None:
        return None
    data = bytes(data)
    if data[:1] == _ZLIB:
        data = zlib.decompress(data[1:])
    return orjson.loads(data)


def usage_state(usage: Usage) -> list[int | bool]:
    return [
        usage.prompt_tokens,
        usage.cached_tokens,
        usage.completion_tokens,
        usage.reasoning_tokens,
        usage.implausible,
    ]


def usage_from(state: list[int | bool] | None) -> Usage:
    return Usage(*state) if state else Usage()


def idempotency_key(text: str) -> str:
    """The Idempotency-Key header value: the first 32 hex digits of sha256(text), where
    text names the record and its round, tool call or step (docs/guides/tool-calling.md)."""
    return hashlib.sha256(text.encode()).hexdigest()[:32]
