"""What a record came to, as the engine stores it."""

from dataclasses import dataclass, field

from batches.engine.calls.usage import Usage


@dataclass
class RecordOutcome:
    """The final result of one record.

    `usage` is what is billed for the record: every answer it got (its re-asks'
    too, when it fails its output contract or a re-ask call fails), and every
    successful request of a workflow record; nothing for a record whose one call
    failed, nor for a tool-calling record that failed mid-loop (batch-api.txt).
    `unbilled` is the usage of the answers it got but is not billed for (that
    tool-calling record's turns): never charged, but counted against the batch's
    max_cost and the organization's budget (docs/concepts/billing.md).
    """

    succeeded: bool
    status_code: int | None = None
    request_id: str = ""
    body: object = None
    error_code: str = ""
    error_message: str = ""
    usage: Usage = field(default_factory=Usage)
    reasks: int = 0  # re-asks its output contract made (batches.engine.loops.contract)
    unbilled: Usage = field(default_factory=Usage)
    # What the guardrails counted of it as it ended (spend.BatchSpend.record_ended), so its flush
    # moves that very figure: priced once a record, and not at all in a batch nothing guards.
    counted_nanos: int = 0

    @classmethod
    def error(cls, code, message, usage=None, unbilled=None):
        return cls(
            succeeded=False,
            error_code=code,
            error_message=message,
            usage=usage or Usage(),
            unbilled=unbilled or Usage(),
        )

    @classmethod
    def from_call(cls, result):
        """A record whose outcome is exactly one call's result."""
        if result.ok:
            return cls(True, result.status_code, result.request_id, result.body, usage=result.usage)
        if result.code:
            # The caller gave up on the record (record_fails_upstream): the server's last answer, if any, is kept.
            return cls(False, result.status_code, result.request_id, result.body, result.code, result.message)
        if result.kind == "response":
            # A non-2xx answer is the record's result: error file, response set.
            return cls(False, result.status_code, result.request_id, result.body)
        if result.kind == "time_limit":
            return cls.error("request_time_limit", result.message)
        return cls.error("upstream_error", result.message)


def strip_openrelay(body):
    """The body the model sees: OpenRelay's own `openrelay` object removed."""
    if "openrelay" not in body:
        return body
    return {k: v for k, v in body.items() if k != "openrelay"}
