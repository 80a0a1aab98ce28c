"""A tool-calling record: model call -> executor -> model call, up to max_rounds.

The loop owns rounds, usage and stripping; the executor (executors.py) only
turns one turn's tool calls into results. Every turn is its own model call
through ctx.caller, so each has the call time limit and failover.

Billing follows batch-api.txt: a record that ends in an output line is billed
the sum of all its turns; a record that fails anywhere in the loop (a model
error, a turn stopped at the limit, an executor failure) is billed nothing,
not even the turns before the failure.
"""

from batches.engine.calls import Usage
from batches.engine.executors import ToolExecutionFailed, make_executor
from batches.engine.outcomes import RecordOutcome, strip_openrelay
from batches.validation import RecordRejected, normalize_tool_config


async def run(ctx, record, body):
    try:
        # Normalized again at run time, so what runs is the clamped config
        # even if the line was accepted under older limits.
        config = normalize_tool_config(body["openrelay"]["tool_config"])
    except RecordRejected as exc:
        return RecordOutcome.error(exc.code, exc.message)
    executor = make_executor(ctx, record.custom_id, config)
    try:
        return await _loop(ctx, executor, strip_openrelay(body), config["max_rounds"])
    finally:
        await executor.close()


async def _loop(ctx, executor, body, max_rounds):
    # The model never sees `openrelay`; `messages` grows by one assistant
    # message and its tool messages per round.
    messages = list(body.get("messages") or ())
    usage, rounds = Usage(), 0
    while True:
        result = await ctx.caller.call(ctx.endpoint, {**body, "messages": messages})
        if not result.ok:
            # Non-2xx answer (response kept), time limit or upstream failure;
            # from_call bills none of it, and earlier turns are dropped too.
            return RecordOutcome.from_call(result)
        usage += result.usage
        message, tool_calls = requested_tool_calls(result.body)
        if tool_calls is None or rounds >= max_rounds:
            # Exhausted rounds end like OpenAI: the last answer, finish_reason "tool_calls".
            return _final(result, usage, rounds)
        try:
            results = await executor.execute(tool_calls)
        except ToolExecutionFailed as exc:
            return RecordOutcome.error("tool_execution_failed", str(exc))
        messages.append(message)
        messages.extend({"role": "tool", "tool_call_id": r.tool_call_id, "content": r.content} for r in results)
        rounds += 1


def requested_tool_calls(response_body):
    """(assistant message, tool_calls) when the first choice asks for tools, else (None, None).

    A turn whose tool calls can't be answered (no list, or a call without a
    string id) is treated as the model's final answer: there is nothing an
    executor could reply to.
    """
    try:
        choice = response_body["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError):
        return None, None
    if choice.get("finish_reason") != "tool_calls" or not isinstance(message, dict):
        return None, None
    tool_calls = message.get("tool_calls")
    if not isinstance(tool_calls, list) or not tool_calls:
        return None, None
    if not all(isinstance(call, dict) and isinstance(call.get("id"), str) for call in tool_calls):
        return None, None
    return message, tool_calls


def _final(result, usage, rounds):
    if not isinstance(result.body, dict):
        # Not a chat completion at all; stored as the server sent it.
        return RecordOutcome(True, result.status_code, result.request_id, result.body, usage=usage)
    body = {**result.body, "usage": usage.as_openai()}
    if rounds:
        body["openrelay"] = {"tool_rounds": rounds}
    return RecordOutcome(True, result.status_code, result.request_id, body, usage=usage)
