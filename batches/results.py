"""Result files, built once: records in input order, in OpenAI's line shapes.

Lines are assembled from stored JSON text without re-parsing bodies, so
finalizing 50,000 records is a single streaming pass.
"""

import hashlib
import tempfile
from dataclasses import dataclass
from hashlib import sha256

import orjson
from django.db import connection

from batches.models import Record, RecordStatus

EXPIRED_MESSAGE = "This request could not be executed before the completion window expired."
CANCELLED_MESSAGE = "This request was not executed because the batch was cancelled."

_FIELDS = (
    "line",
    "custom_id",
    "status",
    "status_code",
    "request_id",
    "response_body",
    "error_code",
    "error_message",
    "reused_from",
    "reused_batch",
)


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
    """Record.public_id without building a Record (the same digest of "batch_pk:line")."""
    return "batch_req_" + hashlib.sha256(f"{batch_pk}:{line}".encode()).hexdigest()[:32]


_SUCCEEDED = RecordStatus.SUCCEEDED.value
_ERROR_FILE_STATUSES = frozenset(s.value for s in (RecordStatus.FAILED, RecordStatus.EXPIRED, RecordStatus.CANCELLED))
_CHUNK = 2000
# The most result text one fetch should carry: a fetch of _CHUNK rows of 130 MB embeddings answers
# held them all (and their lines, joined and encoded: ~4 copies) in the closing worker.
_CHUNK_BYTES = 8 * 1024 * 1024
_BIG_BODY = 1024 * 1024  # a result text longer than this goes to its file alone, a slice at a time


_FILE_STATUSES = {"output": (_SUCCEEDED,), "error": tuple(sorted(_ERROR_FILE_STATUSES))}


def failure_code(error_code, status_code):
    """What an error line failed with, as the line shows it: `http_<status>` for a model's non-2xx
    answer (the line carries the response and no error object), else its error's code (an
    `invalid_output` line carries both the answer and its error)."""
    return f"http_{status_code}" if status_code is not None and not error_code else error_code


def _code_condition(code):
    """SQL and params selecting the error lines whose failure_code is `code`."""
    status = code.removeprefix("http_")
    if code.startswith("http_") and status.isdigit():
        return " AND status_code = %s AND error_code = ''", [int(status)]
    return " AND error_code = %s", [code]


def render(batch, kinds=("output", "error"), code=None):
    """Stream the batch's finished records into two temp files (or only the lines of `kinds`;
    with `code`, only the error lines of that failure_code).

    Rows come straight off a (server-side, on PostgreSQL) cursor in chunks,
    and each chunk's lines go to the files in one write. Records still
    pending or running are in no file; they are not even read.
    """
    output, error = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    counts = [0, 0]
    prefix = f"{batch.pk}:".encode()
    statuses = [status for kind in kinds for status in _FILE_STATUSES[kind]]
    columns = ", ".join(connection.ops.quote_name(Record._meta.get_field(name).column) for name in _FIELDS)
    where, params = _code_condition(code) if code else ("", [])
    sql = (
        f"SELECT {columns} FROM {connection.ops.quote_name(Record._meta.db_table)} "
        f"WHERE batch_id = %s AND status IN ({', '.join(['%s'] * len(statuses))}){where} ORDER BY line"
    )
    with connection.chunked_cursor() as cursor:
        cursor.execute(sql, [batch.pk, *statuses, *params])
        # Rows a fetch: doubled up to _CHUNK while fetches stay small (ordinary results reach it
        # in 11 fetches), cut to what fits _CHUNK_BYTES (at least one row) when results are big.
        size = 1
        while rows := cursor.fetchmany(size):
            fetched = sum(len(row[5] or "") for row in rows)
            size = max(1, min(_CHUNK, size * 2, size * _CHUNK_BYTES // max(1, fetched)))
            out, err = [], []
            for line, custom_id, status, status_code, request_id, body, code, message, source, source_batch in rows:
                # One f-string a line and one encode a chunk: bytes concatenation
                # copied each ~1 KB line a dozen times over.
                head = (
                    f'{{"id":"batch_req_{sha256(prefix + str(line).encode()).hexdigest()[:32]}",'
                    f'"custom_id":{orjson.dumps(custom_id).decode()}'
                )
                # A reused answer says whose it is (batches.reuse): OpenRelay's own key, last.
                tail = f',"openrelay":{_reused(source, source_batch)}' if source else ""
                if status == _SUCCEEDED:
                    out += _with_response(head, status_code, request_id, body, f',"error":null{tail}}}\n')
                elif status_code is not None and not code:
                    err += _with_response(head, status_code, request_id, body, f',"error":null{tail}}}\n')
                elif status_code is not None:
                    # The answer is kept beside the error (invalid_output: what the model said last).
                    error_object = orjson.dumps({"code": code, "message": message}).decode()
                    err += _with_response(head, status_code, request_id, body, f',"error":{error_object}{tail}}}\n')
                else:
                    error_object = orjson.dumps({"code": code, "message": message}).decode()
                    err.append(f'{head},"response":null,"error":{error_object}{tail}}}\n')
            counts[0] += _write(output, out)
            counts[1] += _write(error, err)
    for f in (output, error):
        f.seek(0)
    return RenderedResults(
        output if counts[0] else _closed(output), counts[0], error if counts[1] else _closed(error), counts[1]
    )


def render_one(batch, kind, code=None):
    """One of the two files ("output" or "error") of the records finished so far: (temp file at its start, lines).

    Records still pending or running are left out, so on a finished batch
    this is byte for byte the file finalize stored. `code` keeps only the
    error lines of that failure_code.
    """
    rendered = render(batch, kinds=(kind,), code=code if kind == "error" else None)
    keep, lines = (
        (rendered.output, rendered.output_lines) if kind == "output" else (rendered.error, rendered.error_lines)
    )
    for f in (rendered.output, rendered.error):
        if f is not None and f is not keep:
            f.close()
    return (keep if keep is not None else tempfile.TemporaryFile()), lines


def _closed(f):
    f.close()
    return None


def _reused(custom_id, batch_public_id):
    """A reused line's `openrelay` object (batches.reuse.marker, which results may not import)."""
    source = {"custom_id": custom_id, **({"batch_id": batch_public_id} if batch_public_id else {})}
    return orjson.dumps({"reused_from": source}).decode()


def _with_response(head, status_code, request_id, body, rest):
    """A line with a response, in parts: its body apart when it is big (_write)."""
    before = f'{head},"response":{{"status_code":{status_code},"request_id":{orjson.dumps(request_id).decode()},"body":'
    if len(body or "") > _BIG_BODY:
        return [before, body, "}" + rest]
    return [f"{before}{body or 'null'}}}{rest}"]


def _write(f, parts):
    """Write a chunk's lines (parts of lines: `_with_response`); returns how many lines it wrote.
    One join and encode a chunk, but a big body is written alone, a slice at a time: as one line
    of the chunk's text, a 134 MB embeddings answer was copied three times over (the line, the
    join, the encode)."""
    small = []
    for part in parts:
        if len(part) <= _BIG_BODY:
            small.append(part)
            continue
        f.write("".join(small).encode())
        small = []
        for at in range(0, len(part), _BIG_BODY):
            f.write(part[at : at + _BIG_BODY].encode())
    f.write("".join(small).encode())
    return sum(part.endswith("\n") for part in parts)
