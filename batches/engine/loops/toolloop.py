"""A tool-calling record: model call -> executor -> model call, up to max_rounds.

The loop owns rounds, usage and stripping; the executor (executors.py) only
turns one turn's tool calls into results. Every turn is its own model call
through ctx.caller, so each has the call time limit and failover.

Under an output contract (contract.py) the final answer is checked, and a
failing one re-asked as one more turn of the loop (its turns kept in the
checkpoint with the rounds), up to the contract's max_reasks.

Billing follows batch-api.txt: a record that ends in an output line is billed
the sum of all its turns; a record that fails anywhere in the loop (a model
error, a turn stopped at the limit, an executor failure) is billed nothing,
not even the turns before the failure. Those turns are the outcome's
`unbilled` usage: shown on the batch and counted against its max_cost and its
organization's budget all the same (issue 56), so a loop that always fails
is no free inference. A final answer that fails its output contract is not a
failure mid-loop: like any contract record's (contract.py), it bills every turn.

Checkpoints (batches.engine.checkpoints): after every turn that asks for tools and after
every executor answer, the loop stores the messages it added, its rounds,
its usage and the turn whose tool calls run next. A resumed record sends no
finished turn again and executes no finished round again: at most the step
in flight at the crash repeats, an executor round with the same
Idempotency-Key. Its usage is the checkpoint's plus the turns it runs, so
every turn of the run that produced the output is counted once.
"""

from dataclasses import replace

from batches.endpoints import openai
from batches.engine.checkpoints import decode, usage_from, usage_state
from batches.engine.checks import ContractTooCostly
from batches.engine.context import RecordContext
from batches.engine.loops import contract as contracts
from batches.engine.outcomes import RecordOutcome, strip_openrelay
from batches.engine.tools.executors import ToolExecutionFailed, make_executor
from batches.validation.extensions import RecordRejected, normalize_tool_config


async def run(ctx: RecordContext, record, body, contract=None, shape=None):
    """Run a tool-calling record; `shape` is the loop class of its conversation (ToolLoop: chat)."""
    try:
        # Normalized again at run time, so what runs is the clamped config
        # even if the line was accepted under older limits.
        config = normalize_tool_config(body["openrelay"]["tool_config"])
    except RecordRejected as exc:
        return RecordOutcome.error(exc.code, exc.message)
    # A new executor on every run: a resumed MCP record starts a new session.
    executor = make_executor(ctx, record.custom_id, config)
    loop = shape or ToolLoop
    try:
        return await loop(ctx, record, executor, decode(record.checkpoint), contract).run(
            strip_openrelay(body), config["max_rounds"]
        )
    finally:
        await executor.close()


class ToolLoop:
    """One record's rounds. Its checkpoint holds what the input line doesn't: the messages
    added so far (an assistant message and its tool messages per round), the rounds, the
    usage, and the turn whose tool calls are being executed, if any."""

    def __init__(self, ctx: RecordContext, record, executor, state, contract=None):
        self.ctx, self.record, self.executor, self.contract = ctx, record, executor, contract
        state = state or {}
        self.reasks = state.get("reasks", 0)
        self.added = state.get("added", [])
        self.rounds = state.get("rounds", 0)
        self.usage = usage_from(state.get("usage"))
        self.pending = state.get("pending")  # the assistant message whose tool calls run next

    async def run(self, body, max_rounds):
        # The model never sees `openrelay`.
        messages = list(body.get("messages") or ())
        while True:
            if self.pending is None:
                result = await self.ctx.caller.call(self.ctx.endpoint, {**body, "messages": messages + self.added})
                if not result.ok:
                    # Non-2xx answer (response kept), time limit or upstream failure;
                    # from_call bills none of it, and earlier turns are not billed either.
                    return replace(RecordOutcome.from_call(result), unbilled=self.usage)
                self.usage += result.usage
                message, tool_calls = self.requested(result.body)
                if tool_calls is None or self.rounds >= max_rounds:
                    # Exhausted rounds end like OpenAI: the last answer, as the model gave it.
                    try:
                        errors = (
                            await contracts.check(self.ctx, self.contract, result.body, CHAT) if self.contract else []
                        )
                    except ContractTooCostly as exc:  # its final answer, as an invalid_output's, is billed
                        return contracts.too_costly(exc, self.usage)
                    if not errors:
                        return self.final(result, self.usage, self.rounds, self.reasks)
                    if self.reasks >= self.contract.max_reasks:
                        return contracts.invalid_output(result, self.usage, CHAT, self._counts(), errors)
                    self.added.extend(contracts.reask_turns(self.contract, result.body, CHAT, errors))
                    self.reasks += 1
                    await self._checkpoint()
                    continue
                self.pending = message
                await self._checkpoint()
            try:
                results = await self.executor.execute(
                    self.requested(self.pending, answer=False)[1], self.ctx.key(self.record, "round", self.rounds + 1)
                )
            except ToolExecutionFailed as exc:
                return RecordOutcome.error("tool_execution_failed", str(exc), unbilled=self.usage)
            self.added.extend(self.round_messages(self.pending, results))
            self.pending = None
            self.rounds += 1
            await self._checkpoint()

    def _counts(self):
        return {name: n for name, n in (("tool_rounds", self.rounds), ("reasks", self.reasks)) if n}

    # The conversation's shape: chat completions here, Anthropic Messages in message_tools.

    def requested(self, body, answer=True):
        """(the assistant message, its tool calls as OpenAI `tool_calls`), or (None, None): from an
        answer's body, or (answer=False) from the assistant message kept as `pending`."""
        if not answer:
            return body, body["tool_calls"]
        return requested_tool_calls(body)

    def round_messages(self, assistant, results):
        """What one executed round adds to the conversation."""
        return [assistant, *({"role": "tool", "tool_call_id": r.tool_call_id, "content": r.content} for r in results)]

    def final(self, result, usage, rounds, reasks=0):
        return _final(result, usage, rounds, reasks)

    async def _checkpoint(self):
        await self.ctx.checkpoint(
            self.record,
            {
                "kind": "tools",
                "rounds": self.rounds,
                "reasks": self.reasks,
                "usage": usage_state(self.usage),
                "added": self.added,
                "pending": self.pending,
            },
        )


def requested_tool_calls(response_body):
    """(assistant message, tool_calls) when the first choice's message has tool calls, else (None, None).

    A turn whose tool calls can't be answered (no list, or a call without a
    string id) is treated as the model's final answer: there is nothing an
    executor could reply to.
    """
    try:
        choice = response_body["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError):
        return None, None
    # A turn is a tool round when its message carries tool calls, whatever its
    # finish_reason: some servers (vLLM's parsers, llama.cpp) say "stop".
    if not isinstance(message, dict):
        return None, None
    tool_calls = message.get("tool_calls")
    if not isinstance(tool_calls, list) or not tool_calls:
        return None, None
    if not all(isinstance(call, dict) and isinstance(call.get("id"), str) for call in tool_calls):
        return None, None
    return message, tool_calls


CHAT = openai.CHAT.path


def _final(result, usage, rounds, reasks=0):
    if not isinstance(result.body, dict):
        # Not a chat completion at all; stored as the server sent it.
        return RecordOutcome(True, result.status_code, result.request_id, result.body, usage=usage)
    body = {**result.body, "usage": usage.as_openai()}
    counts = {name: n for name, n in (("tool_rounds", rounds), ("reasks", reasks)) if n}
    if counts:
        body["openrelay"] = counts
    return RecordOutcome(True, result.status_code, result.request_id, body, usage=usage, reasks=reasks)
