"""Output contracts at run time: a record's final answer checked, re-asked when it fails.

The contract (batches.validation.contracts) says what the answer must be: a
JSON object, or JSON valid under a schema. When the answer fails, the model
is asked again in the same conversation: its answer as an assistant turn,
then a user turn with the validator's first errors, up to the contract's
max_reasks. Each re-ask is a model call like any other (the 30-minute call
limit, failover) and a checkpointed step like a tool round: a resumed record
keeps its re-ask turns and sends no finished call again.

Usage is summed across every call of the record, and every call that
returned an answer is billed, whatever the record comes to (issue 56: a
contract that can never pass, `{"not": {}}`, made any answer free). An
answer that passes after re-asks carries `openrelay.reasks`; one that still
fails after the last re-ask ends the record in the error file with code
`invalid_output`, the last answer kept in the line (with
`openrelay.output_errors`) and its usage the summed, billed one. A re-ask
call that fails ends the record with that call's failure, billed the answers
before it: a model's non-2xx answer carries their usage in its body, a call
with no answer says it in its error message (reask_failed).

Plain records run here (run); tool loops call check/reask_turns at their
final answer (toolloop.py); a workflow request that asks for a contract runs
through checked_call (workflow.py).
"""

from dataclasses import dataclass, field, replace

import orjson

from batches import endpoints
from batches.endpoints import openai
from batches.engine import checks
from batches.engine.calls.usage import Usage
from batches.engine.checkpoints import decode, usage_from, usage_state
from batches.engine.outcomes import RecordOutcome, strip_openrelay
from batches.validation.validators import cut as _cut
from batches.validation.validators import errors_of, object_errors

CHAT = openai.CHAT.path
MAX_QUOTED_SCHEMA = 4000  # a schema the model never saw is quoted in the re-ask, up to this


# --------------------------------------------------------------------- the check


def answer_text(body, endpoint):
    """(the answer's text or None, cut at the token limit?, why there is no text)."""
    if not isinstance(body, dict):
        return None, False, "the answer is not a JSON object"
    if _answers(endpoint) == "chat":
        return _chat_text(body)
    return _responses_text(body)


def _answers(endpoint):
    """How the endpoint's answers read (the registry's AnswerShape): "chat" or "responses"."""
    return endpoints.get(endpoint).answers


def _chat_text(body):
    try:
        choice = body["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError):
        return None, False, "the answer has no choices[0].message"
    truncated = choice.get("finish_reason") == "length"
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, list):  # content parts, as some servers send them
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    if isinstance(content, str):
        return content, truncated, None
    refusal = message.get("refusal") if isinstance(message, dict) else None
    if isinstance(refusal, str) and refusal:
        return None, truncated, f"the model refused: {_cut(refusal)}"
    if isinstance(message, dict) and message.get("tool_calls"):
        return None, truncated, "the answer is tool calls, not text"
    return None, truncated, "the answer has no text content"


def _responses_text(body):
    parts = []
    for item in body.get("output") or ():
        if isinstance(item, dict) and item.get("type") == "message":
            for part in item.get("content") or ():
                if isinstance(part, dict) and part.get("type") == "output_text" and isinstance(part.get("text"), str):
                    parts.append(part["text"])
    truncated = body.get("status") == "incomplete"
    if not parts:
        return None, truncated, "the answer has no output_text"
    return "".join(parts), truncated, None


async def check(ctx, contract, body, endpoint):
    """The contract's errors in an answer body: [] when it passes. Off the event loop, in one of
    the engine's checker processes (ctx.checkers; batches.engine.checks), unless the check is known
    cheap; raises checks.ContractTooCostly when it runs past the time limit."""
    text, truncated, missing = answer_text(body, endpoint)
    if text is None:
        return [missing]
    raw = text.encode()
    cost = contract.cost()
    if ctx.checkers is None or checks.inline(cost, raw):
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return [_not_json(exc, truncated)]
        validator = contract.validator()
        if validator is None:
            return object_errors(value)
        if ctx.checkers is None:
            return errors_of(validator, value)
        if validator.is_valid(value):
            return []  # a failing answer's errors are built in a checker
    reply = await ctx.checkers.check(ctx.organization_id, contract.schema_text, raw)
    return reply["errors"] if "errors" in reply else [_not_json(reply["not_json"], truncated)]


def _not_json(exc, truncated):
    if truncated:
        return "the answer was cut off at the token limit (finish_reason: length), so its JSON is incomplete"
    return f"the answer is not valid JSON ({exc})"


# --------------------------------------------------------------------- the re-ask


def reask_turns(contract, body, endpoint, errors):
    """The two turns a re-ask adds: the model's answer, then what failed."""
    text, _, _ = answer_text(body, endpoint)
    lines = ["Your previous answer does not match the required output.", "Problems found:"]
    lines += [f"- {error}" for error in errors]
    if contract.schema_text is None:
        lines.append("Reply again with only a JSON object, and nothing else.")
    elif contract.model_sees_schema:
        lines.append("Reply again with only the corrected JSON, valid under the response format's schema.")
    else:
        schema = contract.schema_text.decode()
        if len(schema) > MAX_QUOTED_SCHEMA:
            schema = schema[:MAX_QUOTED_SCHEMA] + " ...(cut)"
        lines.append(f"Reply again with only the corrected JSON, valid under this JSON Schema: {schema}")
    return [{"role": "assistant", "content": text or ""}, {"role": "user", "content": "\n".join(lines)}]


def with_turns(body, endpoint, turns):
    """The request body with the re-ask turns so far appended to its conversation."""
    if not turns:
        return body
    if _answers(endpoint) == "chat":
        return {**body, "messages": [*(body.get("messages") or ()), *turns]}
    given = body.get("input")
    start = [{"role": "user", "content": given}] if isinstance(given, str) else list(given or ())
    return {**body, "input": [*start, *turns]}


# --------------------------------------------------------------------- ends


def usage_shape(usage, endpoint, last=None):
    """The summed usage in the endpoint's shape. Responses keep the last answer's other detail
    fields (the openai SDK's Response type requires input_tokens_details.cache_write_tokens)."""
    if _answers(endpoint) == "chat":
        return usage.as_openai()
    last = last if isinstance(last, dict) else {}
    input_details = last.get("input_tokens_details") if isinstance(last.get("input_tokens_details"), dict) else {}
    output_details = last.get("output_tokens_details") if isinstance(last.get("output_tokens_details"), dict) else {}
    return {
        **last,
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {**input_details, "cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {**output_details, "reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.total_tokens,
    }


def final_body(body, usage, endpoint, extra):
    """The answer with the record's summed usage and OpenRelay's counts (`extra`) added."""
    if not isinstance(body, dict):
        return body
    summed = usage_shape(usage, endpoint, body.get("usage"))
    return {**body, "usage": summed, "openrelay": {**(body.get("openrelay") or {}), **extra}}


def passed(result, usage, endpoint, extra):
    body = final_body(result.body, usage, endpoint, extra) if extra else result.body
    return RecordOutcome(True, result.status_code, result.request_id, body, usage=usage, reasks=extra.get("reasks", 0))


def invalid_output(result, usage, endpoint, extra, errors):
    """The record fails: its last answer kept in the error line, every answer's usage billed."""
    reasks = extra.get("reasks", 0)
    body = final_body(result.body, usage, endpoint, {**extra, "output_errors": errors})
    tries = f"after {reasks} re-ask{'s' if reasks != 1 else ''}" if reasks else "(no re-asks allowed)"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    message = f"The answer does not match the output contract {tries}: {errors[0]}{more}"
    return RecordOutcome(
        False,
        result.status_code,
        result.request_id,
        body,
        error_code="invalid_output",
        error_message=message,
        usage=usage,
        reasks=reasks,
    )


def too_costly(exc, usage):
    """The answer could not be checked within the time limit (checks.ContractTooCostly): the record
    fails with the checker's code, and, like an `invalid_output`, is billed every answer it got."""
    return RecordOutcome.error(exc.code, str(exc), usage=usage)


def reask_failed(result, usage, endpoint, reasks):
    """A re-ask call failed (`reasks` made, the last one this call): the record ends with the call's
    failure, billed `usage`, the answers before it. A model's non-2xx answer (a JSON object) shows
    that usage as its body's `usage`, beside `openrelay.reasks`; a call with no answer (time limit,
    server unavailable) says it in its error message."""
    outcome = RecordOutcome.from_call(result)
    if result.kind == "response":
        body = outcome.body
        if isinstance(body, dict):
            shown = usage_shape(usage, endpoint)
            body = {**body, "usage": shown, "openrelay": {**(body.get("openrelay") or {}), "reasks": reasks}}
        return replace(outcome, body=body, usage=usage, reasks=reasks)
    answers = f"{reasks} answer{'s' if reasks != 1 else ''}"
    message = f"{outcome.error_message} {usage.total_tokens} tokens of the {answers} before it are billed."
    return replace(outcome, error_message=message.strip(), usage=usage, reasks=reasks)


# --------------------------------------------------------------------- a plain record


@dataclass
class Reasks:
    """A record's re-asks so far: the turns they added, how many, and the usage of every call."""

    turns: list = field(default_factory=list)
    count: int = 0
    usage: Usage = field(default_factory=Usage)

    @classmethod
    def from_state(cls, state):
        state = state or {}
        return cls(state.get("added", []), state.get("reasks", 0), usage_from(state.get("usage")))


async def run(ctx, record, body, contract):
    """A plain record under a contract: call, check, re-ask until it passes or max_reasks runs out."""
    base, endpoint = strip_openrelay(body), ctx.endpoint
    done = Reasks.from_state(decode(record.checkpoint))
    while True:
        result = await ctx.caller.call(endpoint, with_turns(base, endpoint, done.turns))
        if not result.ok:
            if not done.count:
                return RecordOutcome.from_call(result)  # like any failed call: nothing billed
            return reask_failed(result, done.usage, endpoint, done.count)
        done.usage += result.usage
        extra = {"reasks": done.count} if done.count else {}
        try:
            errors = await check(ctx, contract, result.body, endpoint)
        except checks.ContractTooCostly as exc:
            return too_costly(exc, done.usage)
        if not errors:
            return passed(result, done.usage, endpoint, extra)
        if done.count >= contract.max_reasks:
            return invalid_output(result, done.usage, endpoint, extra, errors)
        done.turns += reask_turns(contract, result.body, endpoint, errors)
        done.count += 1
        await ctx.checkpoint(
            record, {"kind": "contract", "reasks": done.count, "usage": usage_state(done.usage), "added": done.turns}
        )


async def checked_call(ctx, body, contract):
    """One workflow request under a contract: (its last CallResult, the usage of all its calls
    that returned an answer: what the request is billed, re-asks made, errors left). The request
    is one step of the workflow: a crash repeats it with its re-asks."""
    endpoint, done = ctx.endpoint, Reasks()
    while True:
        result = await ctx.caller.call(endpoint, with_turns(body, endpoint, done.turns))
        if not result.ok:
            return result, done.usage, done.count, []
        done.usage += result.usage
        try:
            errors = await check(ctx, contract, result.body, endpoint)
        except checks.ContractTooCostly as exc:
            exc.usage = done.usage  # the answers so far are the request's, billed with its failure
            raise
        if not errors or done.count >= contract.max_reasks:
            return result, done.usage, done.count, errors
        done.turns += reask_turns(contract, result.body, endpoint, errors)
        done.count += 1
