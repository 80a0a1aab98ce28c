"""A Message Batch's results: one JSONL line per request, `{"custom_id", "result"}`, in Anthropic's shapes.

- `succeeded`: `message` is the record's stored Message, written as stored (never re-parsed);
- `errored`: the error wrapped twice, `{"type": "error", "error": {"type", "message"}, "request_id"}`
  (Anthropic's SDK cannot read the bare inner object): a model server's error answer, a call
  that failed or timed out, a failed tool loop, or a request refused at create;
- `canceled` and `expired`: the records a cancel or the expiry closed, with no body.

Rendered from the records into a temporary file a chunk of rows at a time, then streamed: memory
stays one chunk whatever the batch's size, and the results stay as long as the batch does (the
OpenAI dialect's result files may be deleted or expire on their own).
"""

import tempfile

import orjson
from django.db import connection

from batches.models import Record, RecordStatus
from openrelay.api.errors import anthropic_error_type

_FIELDS = ("custom_id", "status", "status_code", "request_id", "response_body", "error_code", "error_message")
_FINISHED = (RecordStatus.SUCCEEDED, RecordStatus.FAILED, RecordStatus.EXPIRED, RecordStatus.CANCELLED)
_CHUNK = 1000
# A record's own failure (error_code) -> Anthropic's error type; anything else is an api_error.
ERROR_TYPES = {
    "request_time_limit": "timeout_error",
    "upstream_error": "api_error",
    "tool_execution_failed": "api_error",
    "invalid_tool_config": "invalid_request_error",
    "model_not_found": "not_found_error",
}
# Types Anthropic's result lines may carry (its SDK's ErrorObject union).
RESULT_ERROR_TYPES = frozenset(
    (
        "invalid_request_error",
        "authentication_error",
        "permission_error",
        "not_found_error",
        "rate_limit_error",
        "timeout_error",
        "overloaded_error",
        "api_error",
        "billing_error",
    )
)


def render(batch):
    """The batch's result lines in a temporary file at its start: (file, lines)."""
    out, lines = tempfile.TemporaryFile(), 0
    columns = ", ".join(connection.ops.quote_name(Record._meta.get_field(name).column) for name in _FIELDS)
    sql = (
        f"SELECT {columns} FROM {connection.ops.quote_name(Record._meta.db_table)} "
        f"WHERE batch_id = %s AND status IN ({', '.join(['%s'] * len(_FINISHED))}) ORDER BY line"
    )
    with connection.chunked_cursor() as cursor:
        cursor.execute(sql, [batch.pk, *_FINISHED])
        while rows := cursor.fetchmany(_CHUNK):
            out.write("".join(_line(*row) for row in rows).encode())
            lines += len(rows)
    rejected = [_rejected_line(error) for error in batch.errors or () if error.get("line") is not None]
    out.write("".join(rejected).encode())
    out.seek(0)
    return out, lines + len(rejected)


def _line(custom_id, status, status_code, request_id, body, error_code, error_message):
    head = f'{{"custom_id":{orjson.dumps(custom_id).decode()},"result":'
    if status == RecordStatus.SUCCEEDED:
        return f'{head}{{"type":"succeeded","message":{body or "null"}}}}}\n'
    if status == RecordStatus.CANCELLED:
        return f'{head}{{"type":"canceled"}}}}\n'
    if status == RecordStatus.EXPIRED:
        return f'{head}{{"type":"expired"}}}}\n'
    if status_code is not None:
        kind, message = answered_error(status_code, body)
    else:
        kind, message = ERROR_TYPES.get(error_code, "api_error"), error_message
    return f"{head}{_errored(kind, message, request_id or None)}}}\n"


def _rejected_line(error):
    custom_id = error.get("custom_id") or f"line-{error['line']}"
    kind = ERROR_TYPES.get(error.get("code"), "invalid_request_error")
    if kind == "api_error":
        kind = "invalid_request_error"  # refused at create: always the request's own fault
    head = f'{{"custom_id":{orjson.dumps(custom_id).decode()},"result":'
    return f"{head}{_errored(kind, error.get('message') or '', None)}}}\n"


def _errored(kind, message, request_id):
    error = {"type": "error", "error": {"type": kind, "message": message}, "request_id": request_id}
    return orjson.dumps({"type": "errored", "error": error}).decode()


def answered_error(status_code, body):
    """(Anthropic error type, message) of a model server's error answer, in either dialect's envelope."""
    try:
        parsed = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        parsed = None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    kind = error.get("type") if isinstance(error, dict) and parsed.get("type") == "error" else None
    if kind not in RESULT_ERROR_TYPES:
        kind = anthropic_error_type(status_code)
        if kind not in RESULT_ERROR_TYPES:
            kind = "invalid_request_error" if status_code < 500 else "api_error"
    if not isinstance(message, str) or not message:
        message = f"The model server answered with status {status_code}."
    return kind, message
