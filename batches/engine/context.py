"""The seam between the engine and a record's loop (batches.engine.loops): what a loop may use.

A loop (plain, tool-calling, workflow) gets a `RecordContext` with the
record and its body, and nothing else of the engine: it calls the model
through `ctx.caller` (under its batch's ticket at the model's gate), its
user's servers through `ctx.outbound`, and stores its state with
`ctx.checkpoint` before it goes on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from batches.engine import checkpoints

if TYPE_CHECKING:
    from batches.engine.calls.caller import CallResult
    from batches.engine.checks import Checkers
    from batches.engine.fairness import Ticket
    from batches.engine.store import ClaimedRecord
    from openrelay.lib.outbound import OutboundClient


class Caller(Protocol):
    """A model's calls as a loop makes them (BatchCaller in the engine; a ModelCaller in tests)."""

    async def call(self, endpoint: str, body: dict[str, Any]) -> CallResult: ...


class CheckpointSink(Protocol):
    """Where checkpoints go (the engine's trips.CheckpointWriter): `save` answers once the state
    is stored, and raises checkpoints.LeaseLost when the record is no longer ours."""

    async def save(self, pk: int, data: bytes) -> None: ...


class GatedCaller(Protocol):
    async def call(self, endpoint: str, body: dict[str, Any], ticket: Ticket | None = None) -> CallResult: ...


@dataclass
class RecordContext:
    """What a record coroutine may use: the model caller and the batch's facts."""

    batch_pk: int
    batch_public_id: str
    organization_id: int
    endpoint: str
    model_name: str
    caller: Caller
    workflows_enabled: bool = False
    outbound: OutboundClient | None = None
    checkpoints: CheckpointSink | None = None  # None (a loop driven alone): nothing is stored
    # The batch's output contract from create, normalized (batches.validation.contracts), False or None.
    output_contract: dict[str, Any] | Literal[False] | None = None
    # The engine's checker processes (batches.engine.checks); None (a loop driven alone): checks run inline.
    checkers: Checkers | None = None

    async def checkpoint(self, record: ClaimedRecord, state: dict[str, Any]) -> None:
        """Store `record`'s loop state durably (under its lease) before the loop goes on;
        raises checkpoints.LeaseLost when the record is no longer ours."""
        if self.checkpoints is not None:
            await self.checkpoints.save(record.pk, checkpoints.encode(state))

    def key(self, record: ClaimedRecord, *parts: object) -> str:
        """The Idempotency-Key of one round, tool call or step of `record`: the same on every
        run of it, different for everything else."""
        return checkpoints.idempotency_key(":".join(map(str, (self.batch_public_id, record.line, *parts))))


class BatchCaller:
    """A batch's calls through its model's caller, under the batch's ticket at the gate, each
    reserved against the batch's guardrails first (batches.engine.spend)."""

    def __init__(self, caller: GatedCaller, ticket: Ticket, spend: Any = None) -> None:
        self.caller = caller
        self.ticket = ticket
        self.spend = spend  # its spend.BatchSpend; None: none

    async def call(self, endpoint: str, body: dict[str, Any]) -> CallResult:
        if self.spend is None:
            return await self.caller.call(endpoint, body, self.ticket)
        worst = await self.spend.reserve(body)  # raises fairness.Held: the batch is paused
        usage = None
        try:
            result = await self.caller.call(endpoint, body, self.ticket)
            usage = result.usage
        finally:
            self.spend.settle(worst, usage)
        return result
