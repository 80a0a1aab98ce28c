"""Answers checked against their output contract off the engine's event loop, under a time limit.

Why a process and not a thread (docs/decisions/contract-checks.md): jsonschema-rs lets go of the
GIL in `is_valid` (the event loop kept its full pace beside a 4.6 s `is_valid`), but not while
`iter_errors` builds its errors as Python objects (the loop stood still 6.7 s of an 11 s
`iter_errors`, 0.97 s at a time), and a thread can't be stopped. A checker process can be
killed when its time is up, and caps its own memory (batches.validation.checker).

Not every check pays the hop (~100 us): `inline` keeps on the loop the `is_valid` of an answer
whose work is known small (the schema's counted cost times the answer's bytes, at ~3 ns a unit:
at most ~0.75 ms), with no pattern and no recursion; it passes in ~4 us, as before. Everything
else, and every answer that fails (its error list is built here), goes to a checker.

`Checkers` is one engine's pool: up to `size` processes, started when first needed, each
organization holding at most `size - 1` of them at once (all of them when `size` is 1), so one
tenant's costly checks leave a checker to the others. A check that runs out of time (or of
memory) kills its process and raises ContractTooCostly: its record fails with
`output_contract_too_costly`, and the next check starts a new process.
"""

from __future__ import annotations

import asyncio
import os
import struct
import sys
from pathlib import Path

import orjson

from openrelay.lib.children import die_with_parent

ROOT = Path(__file__).resolve().parents[2]
HEADER = struct.Struct(">II")
LENGTH = struct.Struct(">I")
# ~3 ns per unit of (counted subschemas x answer bytes), is_valid with the parse (measured: 2.9-3.3
# ns on arrays of 100-1,000 elements against 3-52 subschemas): 250,000 units ~0.75 ms on the loop.
INLINE_WORK = 250_000
# A json_object contract parses its answer on the loop up to this (orjson: ~65 us).
INLINE_BYTES = 64 * 1024


class ContractTooCostly(Exception):
    """Checking one answer ran past the time limit or the checker's memory: the record fails
    with `output_contract_too_costly`."""

    code = "output_contract_too_costly"
    usage = None  # the answers its record (or workflow request) got so far: set where they are known


def inline(cost, text):
    """Whether checking `text` against a schema of `cost` (None: json_object) may stay on the loop."""
    if cost is None:
        return len(text) <= INLINE_BYTES
    return not cost.recursive and not cost.patterns and cost.nodes * len(text) <= INLINE_WORK


class Checker:
    """One checker process and its pipes."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls, memory_bytes: int) -> Checker:
        parent = os.getpid()
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "batches.validation.checker",
            str(memory_bytes),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            cwd=ROOT,
            preexec_fn=lambda: die_with_parent(parent),
        )
        return cls(process)

    async def ask(self, schema_text: bytes, text: bytes) -> dict[str, object]:
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None and stdout is not None
        stdin.write(HEADER.pack(len(schema_text), len(text)) + schema_text + text)
        await stdin.drain()
        (length,) = LENGTH.unpack(await stdout.readexactly(LENGTH.size))
        reply: dict[str, object] = orjson.loads(await stdout.readexactly(length))
        return reply

    async def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
        await self.process.wait()  # reaped, its pipes closed (SIGKILL: a few ms)


class Checkers:
    """One engine's checker processes."""

    def __init__(self, size: int, time_limit_s: float, memory_bytes: int) -> None:
        self.size, self.time_limit_s, self.memory_bytes = size, time_limit_s, memory_bytes
        self.idle: list[Checker] = []
        self.started = 0  # processes alive, idle or busy
        self.held: dict[int, int] = {}  # organization -> checkers it holds now
        self.changed = asyncio.Condition()

    async def check(self, organization: int, schema_text: bytes | None, text: bytes) -> dict[str, object]:
        """The checker's reply for one answer; raises ContractTooCostly when it runs out of time
        or memory."""
        checker = await self._take(organization)
        done = False
        try:
            reply = await asyncio.wait_for(checker.ask(schema_text or b"", text), self.time_limit_s)
            done = True
            return reply
        except TimeoutError:
            raise ContractTooCostly(
                f"Checking the answer against the output contract took more than {self.time_limit_s:g} s."
            ) from None
        except (asyncio.IncompleteReadError, ConnectionError):
            raise ContractTooCostly(
                "Checking the answer against the output contract took more than the checker's "
                f"{self.memory_bytes // 2**20} MiB of memory."
            ) from None
        finally:
            await self._give_back(organization, checker, done)

    async def _take(self, organization: int) -> Checker:
        share = max(1, self.size - 1)
        async with self.changed:
            await self.changed.wait_for(
                lambda: self.held.get(organization, 0) < share and (self.idle or self.started < self.size)
            )
            self.held[organization] = self.held.get(organization, 0) + 1
            if self.idle:
                return self.idle.pop()
            self.started += 1
        try:
            return await Checker.start(self.memory_bytes)
        except BaseException:
            await self._give_back(organization, None, False)
            raise

    async def _give_back(self, organization: int, checker: Checker | None, reusable: bool) -> None:
        if checker is not None and not reusable:
            await checker.kill()  # out of time, dead, or cut mid-answer (its pipe holds half a reply)
        async with self.changed:
            self.held[organization] -= 1
            if not self.held[organization]:
                del self.held[organization]
            if checker is not None and reusable:
                self.idle.append(checker)
            else:
                self.started -= 1
            self.changed.notify_all()

    async def close(self) -> None:
        idle, self.idle = self.idle, []
        for checker in idle:
            await checker.kill()
