"""The "http" tool executor: our plain POST protocol (batch-api.txt, tool calling).

One POST per turn to `tool_config["url"]`:

    request  {"custom_id": ..., "context": <as given, or null>, "tool_calls": [...]}
    response {"results": [{"tool_call_id": "...", "content": "..."}, ...]}

The answer is checked strictly: every tool call of the turn needs exactly one
result, and no result may name a call that wasn't made. `content` that is a
string is delivered to the model as is; any other JSON value (object, array,
number, boolean, null) is delivered as its compact JSON text, since a tool
message's content must be text.

Failure messages go into the user's error file. They name what went wrong
but never the authorization value or the URL's path or query (which may
carry a token); OutboundError messages already name only the origin. What
the executor sent (ids quoted in a message, result contents, which become
tool messages the model reads) goes through openrelay.lib.redaction first: an
executor that echoes its credential back must not hand it on.
"""

import orjson

from batches.engine.tools.base import ToolExecutionFailed, ToolResult
from openrelay.lib.outbound import OutboundError
from openrelay.lib.redaction import redact, secrets_of

# tool_call_ids come from the model or the executor; keep quoted ones short.
MAX_QUOTED_ID = 100


class HttpExecutor:
    def __init__(self, outbound, custom_id, tool_config, tenant=None):
        self.outbound = outbound
        self.custom_id = custom_id
        self.tenant = tenant  # whose outbound slots the call holds (the organization)
        self.url = tool_config["url"]
        self.context = tool_config.get("context")
        self.timeout_s = tool_config["timeout_ms"] / 1000
        authorization = tool_config.get("authorization")
        # Sent as given: the user chooses the scheme ("Bearer ...", "Basic ...").
        self.headers = {"Authorization": authorization} if authorization is not None else {}
        self.secrets = secrets_of(authorization)

    async def execute(self, tool_calls, key=None):
        payload = {"custom_id": self.custom_id, "context": self.context, "tool_calls": tool_calls}
        # The round's Idempotency-Key: the same when a resumed record sends this round again.
        headers = {**self.headers, "Idempotency-Key": key} if key else self.headers
        try:
            response = await self.outbound.post_json(
                self.url, payload, headers=headers, timeout_s=self.timeout_s, tenant=self.tenant
            )
        except OutboundError as exc:
            raise ToolExecutionFailed(_describe(exc, self.timeout_s, self.outbound)) from None
        if not response.ok:
            raise ToolExecutionFailed(_status_message(response.status))
        try:
            data = response.json()
        except OutboundError:
            raise ToolExecutionFailed("The tool executor's response is malformed JSON.") from None
        return parse_results(data, [call["id"] for call in tool_calls], self.secrets)

    async def close(self):
        """Nothing is held across rounds: the OutboundClient belongs to the worker."""


def _describe(exc, timeout_s, outbound):
    if exc.kind == "timeout":
        return f"The tool executor timed out: no answer within {timeout_s:g}s."
    if exc.kind == "busy":
        # The wait for a slot is this engine's, not the executor's: its timeout never started.
        return f"The tool executor was never called: {exc.message}."
    if exc.kind == "too_large":
        return f"The tool executor's response is over the size cap ({outbound.max_response_bytes} bytes)."
    if exc.kind == "blocked":
        return f"The tool executor URL is blocked: {exc.message}."
    if exc.kind == "malformed":
        return "The tool executor's response is malformed JSON."
    return f"The tool executor could not be called: {exc.message}."


def _status_message(status):
    message = f"The tool executor answered with non-2xx status {status}."
    if 300 <= status < 400:
        # A redirect could point anywhere, the guard's blocked ranges included.
        message += " Redirects are not followed."
    return message


def parse_results(data, call_ids, secrets=()):
    """The executor's answer as ToolResults in the order of `call_ids`; ToolExecutionFailed if malformed.

    `secrets` (the credential sent) are redacted from the contents and from any id a message quotes.
    """
    if not isinstance(data, dict) or not isinstance(data.get("results"), list):
        raise _malformed('expected an object with a "results" list')
    wanted = set(call_ids)
    by_id = {}
    for index, item in enumerate(data["results"]):
        call_id, content = _result_fields(item, index)
        if call_id not in wanted:
            raise _malformed(f"result {index} names unknown tool_call_id {_quote(call_id, secrets)}")
        if call_id in by_id:
            raise _malformed(f"more than one result for tool_call_id {_quote(call_id, secrets)}")
        by_id[call_id] = redact(content, secrets)
    for call_id in call_ids:
        if call_id not in by_id:
            raise _malformed(f"missing result for tool_call_id {_quote(call_id, secrets)}")
    return [ToolResult(call_id, by_id[call_id]) for call_id in call_ids]


def _result_fields(item, index):
    if not isinstance(item, dict):
        raise _malformed(f"result {index} is not an object")
    call_id = item.get("tool_call_id")
    if not isinstance(call_id, str):
        raise _malformed(f'result {index} has no string "tool_call_id"')
    if "content" not in item:
        raise _malformed(f'result {index} has no "content"')
    content = item["content"]
    return call_id, content if isinstance(content, str) else orjson.dumps(content).decode()


def _malformed(detail):
    return ToolExecutionFailed(f"The tool executor's response is malformed: {detail}.")


def _quote(value, secrets):
    # The limit counts the "..." a cut adds: at most MAX_QUOTED_ID characters of the id are shown.
    return repr(redact(value, secrets, MAX_QUOTED_ID + 3))
