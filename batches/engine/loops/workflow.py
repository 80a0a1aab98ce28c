"""A workflow record: the user's callback picks the next requests (workflows.md).

Step 1 runs the record's own body as request "root". After each step the
results go to the callback URL, which answers `continue` (more requests, run
concurrently as the next step), `completed` (the record succeeds with its
output) or `failed`. Steps, requests and tokens bound the loop; a request
stopped at the call limit is only a failed result, never the record's end.

A request whose body asks for JSON (its response_format, or its own
`openrelay.output_contract`) runs under that output contract (contract.py):
its answer is checked and re-asked within the request, and one still
invalid comes back to the callback as a failed request (`invalid_output`,
its last answer in `response`).

Every request that succeeded is billed, whatever the record comes to, so
every outcome here carries the usage summed so far; so is every answer of a
request under a contract (its re-asks', and an invalid one's), even when the
request comes back failed (issue 56: contract.py).

Checkpoints: after every request of a step (while others of it still run)
and after the step, the loop stores its counters, usage, used ids and the
step's results; after a `continue`, the next step's requests. A resumed
record (its worker died, or handed it back) runs only the requests of its
step that had not finished, or sends the callback of the finished step
again: the callback sees the step in flight at the crash again, never an
earlier one. A record cut by expiry or cancel is billed its checkpoint's
usage (cut.close_unfinished).

The callback's `authorization` never goes further than the callback: what
the callback answers (ids and values quoted in messages, its error message,
its output, the bodies of its next requests) goes through
openrelay.lib.redaction before it is cut short, stored or sent to the model.
"""

import asyncio

from batches.engine.calls.caller import Usage
from batches.engine.checkpoints import decode, usage_from, usage_state
from batches.engine.checks import ContractTooCostly
from batches.engine.context import RecordContext
from batches.engine.loops import contract as contracts
from batches.engine.outcomes import RecordOutcome, strip_openrelay
from batches.validation.contracts import contract_for
from batches.validation.extensions import RecordRejected, normalize_workflow
from openrelay.lib.ids import new_request_id
from openrelay.lib.outbound import OutboundError
from openrelay.lib.redaction import redact, redact_json, secrets_of

ROOT_ID = "root"
ANSWERS = ("continue", "completed", "failed")
MAX_MESSAGE_CHARS = 2000


class WorkflowEnded(Exception):
    """The record ends as an error line with this code and message."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


async def run(ctx: RecordContext, record, body):
    if not ctx.workflows_enabled:
        # Create already rejects these; an admin may have turned workflows off since.
        return RecordOutcome.error("workflow_not_enabled", "Workflows are not enabled for this organization.")
    try:
        config = normalize_workflow(body["openrelay"]["workflow"])
    except RecordRejected as exc:
        return RecordOutcome.error(exc.code, exc.message)
    return await WorkflowLoop(ctx, record, config).run(strip_openrelay(body))


def usage_block(usage):
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }


class WorkflowLoop:
    """One record's loop: step -> callback -> step ... until an answer ends it."""

    def __init__(self, ctx: RecordContext, record, config):
        self.ctx = ctx
        self.record = record
        self.custom_id = record.custom_id
        self.config = config
        self.secrets = secrets_of(config.get("authorization"))
        state = decode(record.checkpoint) or {}
        self.usage = usage_from(state.get("usage"))  # every succeeded request so far: what is billed
        self.steps = state.get("steps", 0)  # steps started
        self.requests = state.get("requests", 0)  # requests of the steps started
        self.ids = set(state.get("ids", [ROOT_ID]))
        self.next = state.get("next")  # the step in flight's requests, [[id, body]], or None
        self.done = state.get("done") or {}  # its finished requests: id -> result
        self.results = state.get("results")  # the last step's results, while its callback is due

    async def run(self, root_body):
        try:
            if self.steps == 0:
                self._start_step([(ROOT_ID, root_body)])
            while True:
                if self.results is None:
                    await self._step()
                answer = await self._callback(self.results)
                if answer["status"] == "completed":
                    return self._completed(answer.get("output"))
                if answer["status"] == "failed":
                    raise WorkflowEnded("workflow_failed", _failure_message(answer, self.secrets))
                self._start_step(self._next_requests(answer))
                await self._checkpoint()
        except WorkflowEnded as end:
            return RecordOutcome.error(end.code, redact(end.message, self.secrets), usage=self.usage)

    # --- steps ---------------------------------------------------------------

    def _start_step(self, requests):
        self.steps += 1
        self.requests += len(requests)
        self.next, self.done, self.results = [list(request) for request in requests], {}, None

    async def _step(self):
        todo = [(request_id, body) for request_id, body in self.next if request_id not in self.done]
        await asyncio.gather(*(self._run_request(request_id, body) for request_id, body in todo))
        self.results = [self.done[request_id] for request_id, _ in self.next]
        self.next, self.done = None, {}
        if self.usage.total_tokens > self.config["max_tokens"]:
            raise WorkflowEnded(
                "workflow_limit_exceeded",
                f"The workflow used {self.usage.total_tokens} tokens after "
                f"step {self.steps}, more than its max_tokens of {self.config['max_tokens']}.",
            )
        await self._checkpoint()

    async def _run_request(self, request_id, body):
        result, usage = await self._request(request_id, body)
        self.usage += usage
        self.done[request_id] = result
        if len(self.done) < len(self.next):
            # Others of the step still run: keep this one's answer (and its billing) safe.
            await self._checkpoint()

    async def _checkpoint(self):
        await self.ctx.checkpoint(
            self.record,
            {
                "kind": "workflow",
                "steps": self.steps,
                "requests": self.requests,
                "usage": usage_state(self.usage),
                "ids": sorted(self.ids),
                "next": self.next,
                "done": self.done or None,
                "results": self.results,
            },
        )

    async def _request(self, request_id, body):
        """One request of a step: (its result for the callback, its billable usage)."""
        model = body.get("model")
        if model != self.ctx.model_name:
            message = (
                f"The request names model {_shown(model, self.secrets)}, but this batch runs "
                f"'{self.ctx.model_name}'; every request of a workflow must name the batch's model."
            )
            return _failed(request_id, None, "model_mismatch", message), Usage()
        try:
            contract = contract_for(body, self.ctx.endpoint)
        except RecordRejected as exc:
            return _failed(request_id, None, exc.code, redact(exc.message, self.secrets)), Usage()
        if contract is not None:
            return await self._checked_request(request_id, strip_openrelay(body), contract)
        result = await self.ctx.caller.call(self.ctx.endpoint, strip_openrelay(body))
        if result.ok:
            response = {"status_code": result.status_code, "body": result.body}
            return {"id": request_id, "status": "succeeded", "response": response, "error": None}, result.usage
        return self._call_failed(request_id, result)

    async def _checked_request(self, request_id, body, contract):
        endpoint = self.ctx.endpoint
        try:
            result, usage, reasks, errors = await contracts.checked_call(self.ctx, body, contract)
        except ContractTooCostly as exc:  # this request fails; the workflow's callback decides what next
            return _failed(request_id, None, exc.code, str(exc)), exc.usage or Usage()
        if not result.ok:
            failed, _ = self._call_failed(request_id, result)
            return failed, usage  # the answers before the failed re-ask are billed
        extra = {"reasks": reasks} if reasks else {}
        if not errors:
            outcome = contracts.passed(result, usage, endpoint, extra)
            response = {"status_code": result.status_code, "body": outcome.body}
            return {"id": request_id, "status": "succeeded", "response": response, "error": None}, usage
        outcome = contracts.invalid_output(result, usage, endpoint, extra, errors)
        response = {"status_code": result.status_code, "body": outcome.body}
        return _failed(request_id, response, "invalid_output", outcome.error_message), usage

    def _call_failed(self, request_id, result):
        if result.kind == "response":
            response = {"status_code": result.status_code, "body": result.body}
            message = result.message or f"The model answered HTTP {result.status_code}{_upstream_reason(result.body)}"
            return _failed(request_id, response, result.code or "upstream_error", message), Usage()
        code = result.code or ("request_time_limit" if result.kind == "time_limit" else "upstream_error")
        return _failed(request_id, None, code, result.message), Usage()

    def _next_requests(self, answer):
        requests = self._parse_requests(answer.get("requests"))
        if self.steps >= self.config["max_steps"]:
            raise WorkflowEnded(
                "workflow_limit_exceeded",
                f"The callback answered 'continue' after step {self.steps}, "
                f"but the workflow's max_steps is {self.config['max_steps']}.",
            )
        if self.requests + len(requests) > self.config["max_requests"]:
            raise WorkflowEnded(
                "workflow_limit_exceeded",
                f"Step {self.steps + 1} asks for {len(requests)} requests "
                f"after {self.requests}, more than the workflow's max_requests of "
                f"{self.config['max_requests']}.",
            )
        return requests

    def _parse_requests(self, items):
        if not isinstance(items, list) or not items:
            raise self._malformed("'requests' must be a non-empty array")
        requests = []
        for index, item in enumerate(items):
            if not isinstance(item, dict) or not isinstance(item.get("body"), dict):
                raise self._malformed(f"requests[{index}] must be an object with an object 'body'")
            request_id = item.get("id")
            if not isinstance(request_id, str) or not request_id:
                raise self._malformed(f"requests[{index}].id must be a non-empty string")
            if request_id in self.ids:
                raise self._malformed(
                    f"requests[{index}].id {_shown(request_id, self.secrets)} is already used in this record"
                )
            self.ids.add(request_id)
            requests.append((request_id, redact_json(item["body"], self.secrets)))
        return requests

    # --- the callback --------------------------------------------------------

    async def _callback(self, results):
        payload = {
            "custom_id": self.custom_id,
            "context": self.config.get("context"),
            "step": self.steps,
            "results": results,
            "usage": usage_block(self.usage),
        }
        authorization = self.config.get("authorization")
        # The step's Idempotency-Key: the same when a resumed record calls back for this step again.
        headers = {"Idempotency-Key": self.ctx.key(self.record, "step", self.steps)}
        if authorization:
            headers["Authorization"] = authorization
        try:
            response = await self.ctx.outbound.post_json(
                self.config["url"],
                payload,
                headers=headers,
                timeout_s=self.config["timeout_ms"] / 1000,
                tenant=self.ctx.organization_id,  # the call holds one of the organization's outbound slots
            )
            if not response.ok:
                raise self._callback_failed(f"answered HTTP {response.status}")
            answer = response.json()
        except OutboundError as exc:
            raise self._callback_failed(exc.message) from None
        if not isinstance(answer, dict):
            raise self._malformed("the answer is not a JSON object")
        if answer.get("status") not in ANSWERS:
            raise self._malformed(
                f"unknown status {_shown(answer.get('status'), self.secrets)}; expected one of "
                "'continue', 'completed', 'failed'"
            )
        return answer

    def _callback_failed(self, reason):
        return WorkflowEnded(
            "workflow_callback_failed", f"The workflow callback failed after step {self.steps}: {reason}."
        )

    def _malformed(self, reason):
        return self._callback_failed(f"malformed answer: {reason}")

    # --- ends ----------------------------------------------------------------

    def _completed(self, output):
        body = {
            "object": "openrelay.workflow",
            "status": "completed",
            "output": redact_json(output, self.secrets),
            "steps": self.steps,
            "requests": self.requests,
            "usage": usage_block(self.usage),
        }
        return RecordOutcome(True, 200, new_request_id(), body, usage=self.usage)


def _failed(request_id, response, code, message):
    return {"id": request_id, "status": "failed", "response": response, "error": {"code": code, "message": message}}


def _upstream_reason(body):
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return f": {_short(message)}" if isinstance(message, str) and message else "."


def _failure_message(answer, secrets):
    error = answer.get("error")
    message = error.get("message") if isinstance(error, dict) else None
    if not isinstance(message, str) or not message:
        return "The workflow callback answered 'failed' without an error message."
    return redact(message, secrets, MAX_MESSAGE_CHARS)


def _shown(value, secrets, limit=200):
    """A value the callback sent, quoted for a message: redacted, then cut."""
    if isinstance(value, str):
        return repr(redact(value, secrets, limit))
    return redact(repr(value), secrets, limit)


def _short(text, limit=200):
    return text if len(text) <= limit else text[: limit - 3] + "..."
