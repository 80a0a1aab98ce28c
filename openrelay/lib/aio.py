"""Running an asyncio program: on uvloop where it is installed.

uvloop's event loop (libuv, in C) spends fewer instructions per socket event
than asyncio's selector loop: the simulated model server needed 12% fewer
per request on it (callgrind). Where uvloop is missing (Windows), asyncio's
own loop runs the same code. Only the simulator runs on it: the engine's
workers stay on asyncio's loop, where uvloop measured no gain when they
called model servers through aiohttp's client (they now use their own
transport, batches/engine/calls/transport.py; not measured again since).
"""

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is a Linux/macOS dependency
    uvloop = None


_T = TypeVar("_T")


def run(coroutine: Coroutine[Any, Any, _T]) -> _T:
    """asyncio.run(coroutine), on a uvloop loop when uvloop is available."""
    if uvloop is None:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)
