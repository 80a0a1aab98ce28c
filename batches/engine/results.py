"""Result files, built once: records in input order, in OpenAI's line shapes.

Lines are assembled from stored JSON text without re-parsing bodies, so
finalizing 50,000 records is a single streaming pass.
"""

import tempfile
from dataclasses import dataclass

import orjson

from batches.models import Record, RecordStatus

EXPIRED_MESSAGE = "This request could not be executed before the completion window expired."
CANCELLED_MESSAGE = "This request was not executed because the batch was cancelled."

_FIELDS = ("pk", "line", "custom_id", "status", "status_code", "request_id", "response_body", "error_code", "error_message")


@dataclass
class RenderedResults:
    output: object  # a temp file, or None when no line went there
    output_lines: int
    error: object
    error_lines: int

    def close(self):
        for f in (self.output, self.error):
            if f is not None:
                f.close()


def record_public_id(batch_pk, line):
    return Record(batch_id=batch_pk, line=line).public_id


def render(batch):
    """Stream the batch's finished records into two temp files."""
    output, error = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    counts = [0, 0]
    rows = Record.objects.filter(batch_id=batch.pk).order_by("line").values_list(*_FIELDS)
    for pk, line, custom_id, status, status_code, request_id, body, code, message in rows.iterator(chunk_size=2000):
        head = b'{"id":"' + record_public_id(batch.pk, line).encode() + b'","custom_id":' + orjson.dumps(custom_id)
        if status == RecordStatus.SUCCEEDED:
            output.write(head + _response(status_code, request_id, body) + b',"error":null}\n')
            counts[0] += 1
        elif status_code is not None:
            error.write(head + _response(status_code, request_id, body) + b',"error":null}\n')
            counts[1] += 1
        elif status in (RecordStatus.FAILED, RecordStatus.EXPIRED, RecordStatus.CANCELLED):
            error.write(head + b',"response":null,"error":' + orjson.dumps({"code": code, "message": message}) + b"}\n")
            counts[1] += 1
    for f in (output, error):
        f.seek(0)
    return RenderedResults(output if counts[0] else _closed(output), counts[0], error if counts[1] else _closed(error), counts[1])


def _closed(f):
    f.close()
    return None


def _response(status_code, request_id, body):
    return (
        b',"response":{"status_code":'
        + str(status_code).encode()
        + b',"request_id":'
        + orjson.dumps(request_id)
        + b',"body":'
        + (body.encode() if body else b"null")
        + b"}"
    )
