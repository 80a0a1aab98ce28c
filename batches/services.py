"""Batch writes that span several steps: create (file -> records -> batch) and cancel."""

import re
import time
from array import array
from bisect import bisect_left
from contextlib import contextmanager
from decimal import Decimal
from itertools import islice

import orjson
from django.db import connection, transaction
from django.utils import timezone

from batches import guardrails, lifecycle, live, reuse, risk, windows
from batches.models import Batch, BatchStatus, Record, RecordStatus
from batches.validation import contracts
from batches.validation.jsonl import MAX_RECORDS, FileRejected, scan, too_many_message
from batches.validation.params import CreateParams
from batches.validation.records import RecordChecker
from files import services as files
from files.models import File, Purpose
from openrelay.api.errors import ApiError, Conflict
from openrelay.core.models import Model, Price

INSERT_BATCH_SIZE = 5000
INLINE_FILENAME = "batch_requests.jsonl"
# A batch in these statuses is already being cancelled: cancel again is a no-op.
CANCELLED_OR_CANCELLING = (BatchStatus.CANCELLING, BatchStatus.CANCELLED)


def create_batch(*, organization, params, max_records=None, admit=None):
    """Validate every record of the input and create the batch (the engines pick it up).

    `params` is the create request as one `CreateParams` (batches.validation.params: the API and
    the dashboard parse it from a body, a retry and Message Batches build it). The input is either
    an uploaded purpose-`batch` file or inline `requests`, which are first stored as such a file so
    every batch has one. Raises ApiError (400) for a request that can't make a batch at all, or one
    of more than `max_records` requests (default: the scan's MAX_RECORDS; Message Batches take
    more); BudgetExceeded (402) when the organization has spent its monthly budget.

    `admit(model pk, ScanResult)`, when given, judges the scanned batch against its window
    (batches.estimate.admission, a layer above): its answer is stored on the batch, and a batch it
    finds late is warned of (`batch.at_risk`); it raises ApiError to refuse the batch.
    """
    guardrails.check_budget(organization)
    now = timezone.now()
    if params.requests is None:
        file, param = _find_input_file(organization, params.input_file_id, now), "input_file_id"
    else:
        file, param = _store_inline_requests(organization, params.requests, now, max_records), "requests"
    fields = dict(
        organization=organization,
        file=file,
        now=now,
        endpoint=params.endpoint,
        window=windows.parse(params.completion_window) if params.completion_window else windows.default(),
        metadata=params.metadata,
        output_expires_after_s=params.output_expires_after_s,
        priority=params.priority,
        max_cost_nanos=params.max_cost_nanos,
        **(params.breaker or guardrails.Breaker.default()).as_fields(),
        output_contract=params.output_contract,
        admit=admit,
        reuse=params.reuse,
    )
    committed = False
    try:
        checker = reuse.Twins(_checker(params.endpoint, organization, params.output_contract), params.reuse)
        if connection.vendor == "postgresql":
            batch = _create_streaming(file, checker, param, fields, max_records)
        else:
            batch = _create_after_scan(file, checker, param, fields, max_records)
        committed = True
    finally:
        if params.requests is not None and not committed:
            files.delete_file(file)  # a refused inline input belongs to no batch
    return batch


def _create_after_scan(file, checker, param, fields, max_records):
    # The file is read before the transaction opens: on SQLite a write
    # transaction locks the whole database, and a 200 MB pass takes ~0.5 s.
    result = _scan_file(file, checker, param, max_records=max_records)
    with transaction.atomic():
        _lock_input_file(file, fields["organization"])
        batch = _create_batch_row(checker=checker, result=result, **fields)
        _executemany_records(batch, result.rows(), checker.row_state)
        reuse.mark_leaders(batch.pk, checker.twins_of)
        reuse.answer_from_cache(batch, checker)
        _start_or_fail(batch, file, result)
    return batch


def _create_streaming(file, checker, param, fields, max_records):
    """PostgreSQL: records go into COPY as the scan accepts them, under the batch id taken
    first, so the server stores them (on another core) while this process reads on.

    Record.batch has no database constraint, so the rows may precede their
    batch's row inside the transaction; a refused file rolls them back. The
    input file's row is locked first: a delete of it waits for the scan.
    20,000 records: create 0.45-0.49 -> 0.34-0.42 s (min-median of ten;
    tests/perf/bench_create.py measures 50,000: 3.0x a bare parse).
    """
    with transaction.atomic():
        _lock_input_file(file, fields["organization"])
        pk = _next_batch_pk()
        with _record_copy(pk, checker.row_state) as write:
            result = _scan_file(file, checker, param, sink=write, max_records=max_records)
        reuse.mark_leaders(pk, checker.twins_of)
        batch = _create_batch_row(pk=pk, checker=checker, result=result, **fields)
        reuse.answer_from_cache(batch, checker)
        _start_or_fail(batch, file, result)
    return batch


def _next_batch_pk():
    with connection.cursor() as cursor:
        cursor.execute("SELECT nextval(pg_get_serial_sequence(%s, 'id'))", [Batch._meta.db_table])
        return cursor.fetchone()[0]


def _find_input_file(organization, input_file_id, now):
    if "\x00" in input_file_id:  # no id has one, and PostgreSQL can't even look it up
        raise _file_not_found(input_file_id, organization)
    file = File.objects.for_org(organization).filter(public_id=input_file_id).first()
    _check_input_file(file, input_file_id, organization, now)
    return file


def _file_not_found(input_file_id, organization):
    return ApiError(
        f"Cannot find file {input_file_id}, or organization '{organization.name}' does not have access to it.",
        param="input_file_id",
        code="file_not_found",
    )


def _check_input_file(file, input_file_id, organization, now):
    if file is None:
        raise _file_not_found(input_file_id, organization)
    if file.purpose != Purpose.BATCH:
        raise ApiError(
            f"File {input_file_id} has purpose '{file.purpose}'; a batch needs a file uploaded with purpose 'batch'.",
            param="input_file_id",
            code="invalid_value",
        )
    if file.expires_at is not None and file.expires_at <= now:
        raise ApiError(f"File {input_file_id} has expired.", param="input_file_id", code="invalid_value")


def _store_inline_requests(organization, requests, now, max_records):
    max_records = max_records or MAX_RECORDS
    if not requests:
        raise ApiError("The input contains no requests.", param="requests", code="empty_file")
    if len(requests) > max_records:
        raise ApiError(too_many_message(max_records), param="requests", code="too_many_requests")
    return files.create_file_from_chunks(
        organization=organization,
        filename=INLINE_FILENAME,
        purpose=Purpose.BATCH,
        chunks=_inline_lines(requests),
        expires_at=files.default_expiry(Purpose.BATCH, now),
    )


def _inline_lines(requests):
    for index, item in enumerate(requests):
        try:
            yield orjson.dumps(item) + b"\n"
        except orjson.JSONEncodeError as exc:  # e.g. an integer beyond 64 bits
            raise ApiError(
                f"Invalid 'requests[{index}]': {exc}.", param=f"requests[{index}]", code="invalid_value"
            ) from None


def _checker(endpoint, organization, output_contract=None):
    return RecordChecker(
        endpoint,
        models=dict(Model.objects.filter(enabled=True).values_list("name", "pk")),
        workflows_enabled=organization.workflows_enabled,
        output_contract=contracts.batch_contract(output_contract),
    )


def _scan_file(file, checker, param, sink=None, max_records=None):
    limit = {} if max_records is None else {"max_records": max_records}
    try:
        with files.open_content(file) as stream:
            return scan(stream, checker, sink=sink, **limit)
    except FileRejected as rejected:
        raise ApiError(rejected.message, param=param, code=rejected.code) from None


def check_input(
    *, organization, endpoint, input_file_id=None, requests=None, observe=None, reuse_mode=reuse.DEFAULT_MODE
):
    """Create's validation of the input without creating anything: (ScanResult, RecordChecker, read_record).

    The same lookups, limits and record checks as create_batch, so a quote
    accepts and rejects exactly what a create would. Inline requests are read
    from memory, never stored. `observe(obj, line)` sees each accepted record
    that would call the model (a twin, batches.reuse, would not: `reuse_mode`);
    `read_record(lines)` reads accepted records again by line, as {line: obj}.
    Raises ApiError (400) where create would.
    """
    checker = reuse.Twins(_checker(endpoint, organization), reuse_mode)
    if observe is not None:
        checker = _Observed(checker, observe)
    if requests is None:
        file = _find_input_file(organization, input_file_id, timezone.now())
        spans = _Spans()
        result = _scan_file(file, checker, "input_file_id", sink=spans.add)
        return result, checker, lambda lines: spans.read(file, lines)
    if not requests:
        raise ApiError("The input contains no requests.", param="requests", code="empty_file")
    if len(requests) > MAX_RECORDS:
        raise ApiError(too_many_message(MAX_RECORDS), param="requests", code="too_many_requests")
    try:
        result = scan(_ChunkStream(_inline_lines(requests)), checker)
    except FileRejected as rejected:
        raise ApiError(rejected.message, param="requests", code=rejected.code) from None
    return result, checker, lambda lines: {line: requests[line - 1] for line in lines}


class _Spans:
    """Where each accepted record is in the file, in three int64 arrays (24 bytes a record, not
    create's rows with their custom_ids), so a quote can read a few records again."""

    def __init__(self):
        self.lines, self.offsets, self.lengths = array("q"), array("q"), array("q")

    def add(self, row):
        line, _, offset, length = row
        self.lines.append(line)
        self.offsets.append(offset)
        self.lengths.append(length)

    def read(self, file, lines):
        """{line: record} of these accepted lines; the reads walk the file forward."""
        found = {}
        with files.open_content(file) as stream:
            for line in sorted(lines):
                index = bisect_left(self.lines, line)  # lines are ascending
                stream.seek(self.offsets[index])
                found[line] = orjson.loads(stream.read(self.lengths[index]))
        return found


class _Observed:
    """A reuse.Twins that shows each record it accepts, but twins, to `observe` (the quote counts them)."""

    def __init__(self, checker, observe):
        self.checker, self.observe = checker, observe

    def __getattr__(self, name):
        return getattr(self.checker, name)

    def check(self, obj, line):
        custom_id = self.checker.check(obj, line)
        if line not in self.checker.leader_of:  # a twin makes no call of its own
            self.observe(obj, line)
        return custom_id


class _ChunkStream:
    """read() over an iterator of byte chunks: the inline lines as scan reads a file."""

    def __init__(self, chunks):
        self.chunks = chunks

    def read(self, size=-1):
        return next(self.chunks, b"")


def _lock_input_file(file, organization):
    # Locking the row orders this create against a concurrent delete of the
    # file: either the delete sees the pin, or this sees the file gone.
    if not File.objects.select_for_update().filter(pk=file.pk).exists():
        raise _file_not_found(file.public_id, organization)


def _create_batch_row(*, organization, file, checker, result, now, priority, window, admit, pk=None, **fields):
    price = Price.objects.filter(model_id=checker.model_pk).first() if checker.model_pk else None
    admission = admit(checker.model_pk, result) if admit is not None and result.accepted and checker.model_pk else None
    batch = Batch.objects.create(
        pk=pk,
        organization=organization,
        input_file=file,
        input_file_public_id=file.public_id,
        priority=priority,
        model_id=checker.model_pk,
        model_name=checker.model_name or "",
        errors=_storable(result.errors) or None,
        total_count=result.accepted,
        twin_count=len(checker.leader_of),
        deployments_key=reuse.deployments_key(checker.model_pk) if fields.get("reuse") == "cache" else "",
        created_at=now,
        completion_window=window.name,
        expires_at=now + window.duration,
        price_input=price.input_per_mtok if price else Decimal("0"),
        price_cached_input=price.effective_cached_input_per_mtok if price else Decimal("0"),
        price_output=price.output_per_mtok if price else Decimal("0"),
        price_multiplier=window.multiplier(priority),
        admission=admission,
        **fields,
    )
    if admission is not None and admission["fits_window"] is False:
        risk.warn_at_admission(batch, now)
    return batch


def _storable(errors):
    """Rejections as a JSON column can hold them: PostgreSQL's jsonb refuses NUL
    (\\u0000), and messages may quote what a line said (a model name, a key)."""
    return [
        {key: value.replace("\x00", "\ufffd") if isinstance(value, str) else value for key, value in error.items()}
        for error in errors
    ]


def _start_or_fail(batch, file, result):
    if not result.accepted:
        # Nothing can run: the batch is created only to report its rejections.
        lifecycle.transition(batch, BatchStatus.FAILED, now=batch.created_at)
        return
    # Records point into the file by offset; the pin stops its deletion until
    # the engine unpins it at the end.
    files.pin(file)
    _announce_on_commit(batch)


def _announce_on_commit(batch):
    # Nothing to enqueue: every engine reads the running batches every
    # POLL_S. robust: a channel-layer hiccup must not turn a created (or
    # cancelled) batch into an error answer.
    transaction.on_commit(lambda: live.batch_changed_sync(batch.pk), robust=True)


# ---------------------------------------------------------------------------
# Record rows


def _record_columns():
    """Every non-null column of Record but the pk: (column, value a new row takes).

    The columns the scan fills come first (a row's status and leader: batches.reuse.Twins.row_state).
    Derived from the model, so a column added later is filled with its default instead of breaking inserts.
    """
    from_scan = ["batch_id", "line", "custom_id", "offset", "length", "status", "leader_line", "request_key"]
    defaults = [
        (field.column, field.get_default())
        for field in Record._meta.concrete_fields
        if not field.primary_key and not field.null and field.column not in from_scan
    ]
    return from_scan, defaults


# A new batch's (line, custom_id, offset, length) rows go in bulk: PostgreSQL's
# as the scan accepts them (_record_copy), other backends' one executemany per
# chunk after it. Both skip building 50,000 model instances, which is most of
# bulk_create's cost (tests/perf/bench_create.py measures all three).


def _bulk_create_records(batch, rows):
    # The ORM way, kept as the benchmark's reference point.
    Record.objects.bulk_create(
        (
            Record(batch=batch, line=line, custom_id=custom_id, offset=offset, length=length)
            for line, custom_id, offset, length in rows
        ),
        batch_size=INSERT_BATCH_SIZE,
    )


def _column_list(columns):
    return ", ".join(connection.ops.quote_name(column) for column in columns)


_PENDING_ROW = (RecordStatus.PENDING.value, None, None)


def _no_twins(line):
    return _PENDING_ROW


def _executemany_records(batch, rows, row_state=_no_twins):
    from_scan, defaults = _record_columns()
    columns = from_scan + [column for column, _ in defaults]
    constants = tuple(value for _, value in defaults)
    sql = (
        f"INSERT INTO {connection.ops.quote_name(Record._meta.db_table)} ({_column_list(columns)}) "
        f"VALUES ({', '.join(['%s'] * len(columns))})"
    )
    rows = iter(rows)
    with connection.cursor() as cursor:
        while chunk := [(batch.pk, *row, *row_state(row[0]), *constants) for row in islice(rows, INSERT_BATCH_SIZE)]:
            cursor.executemany(sql, chunk)


def _copy_records(batch, rows):
    # COPY of rows already scanned: the benchmark times the insert alone this way.
    with _record_copy(batch.pk) as write:
        for row in rows:
            write(row)


# COPY's text format: these four characters are escaped in a value (NUL never reaches a custom_id).
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
_NEEDS_ESCAPES = re.compile(r"[\\\t\n\r]").search  # a search is half a translate's cost, and ids rarely need one
_COPY_CHUNK = 2000


@contextmanager
def _record_copy(batch_pk, row_state=_no_twins):
    """COPY into the records table: yields write((line, custom_id, offset, length)).

    COPY skips per-row INSERT parsing and planning: the fastest way into
    PostgreSQL. Rows go as text this module formats, a chunk a write:
    psycopg's write_row adapts each value on its own (0.10 s of 20,000
    rows' 0.24 s insert; formatting them here takes ~0.03 s).
    """
    from_scan, defaults = _record_columns()
    tail = "".join(f"\t{str(value).translate(_COPY_ESCAPES)}" for _, value in defaults) + "\n"
    head = f"{batch_pk}\t"
    columns = _column_list(from_scan + [column for column, _ in defaults])
    table = connection.ops.quote_name(Record._meta.db_table)
    pending = []

    def write(row):
        line, custom_id, offset, length = row
        if _NEEDS_ESCAPES(custom_id):
            custom_id = custom_id.translate(_COPY_ESCAPES)
        status, leader, key = row_state(line)
        leader = "\\N" if leader is None else leader  # COPY's null
        key = "\\N" if key is None else key
        pending.append(f"{head}{line}\t{custom_id}\t{offset}\t{length}\t{status}\t{leader}\t{key}{tail}")
        if len(pending) >= _COPY_CHUNK:
            copy.write("".join(pending).encode())
            pending.clear()

    with connection.cursor() as cursor:
        with cursor.connection.cursor().copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
            yield write
            if pending:
                copy.write("".join(pending).encode())


# ---------------------------------------------------------------------------
# Retry


RETRYABLE_RECORD_STATUSES = (RecordStatus.FAILED, RecordStatus.EXPIRED, RecordStatus.CANCELLED)


def retry_failed(batch):
    """A new batch of the finished batch's error-file records, their input lines copied as they were.

    Same endpoint, priority and metadata; the new input file is named
    `<batch id>_retry.jsonl`. Lines rejected at create are not records and
    are not retried (they would be rejected again). 409 while the batch
    runs; 400 when nothing failed or the input file is gone.
    """
    if batch.status not in (BatchStatus.COMPLETED, BatchStatus.EXPIRED, BatchStatus.CANCELLED):
        raise Conflict(
            f"Only a completed, expired or cancelled batch can be retried; this one is '{batch.status}'.",
            code="batch_not_finished",
        )
    spans = list(
        batch.records.filter(status__in=RETRYABLE_RECORD_STATUSES).order_by("line").values_list("offset", "length")
    )
    if not spans:
        raise ApiError(
            f"Batch {batch.public_id} has no failed, expired or cancelled records to retry.", code="nothing_to_retry"
        )
    source = batch.input_file
    if source is None:
        raise ApiError(
            f"The input file of batch {batch.public_id} has been deleted or has expired, so its lines "
            "can no longer be read.",
            param="input_file_id",
            code="input_file_gone",
        )
    now = timezone.now()
    with files.open_content(source) as stream:
        retry_file = files.create_file_from_chunks(
            organization=batch.organization,
            filename=f"{batch.public_id}_retry.jsonl",
            purpose=Purpose.BATCH,
            chunks=_lines_at(stream, spans),
            expires_at=files.default_expiry(Purpose.BATCH, now),
        )
    try:
        params = CreateParams(
            endpoint=batch.endpoint,
            input_file_id=retry_file.public_id,
            metadata=batch.metadata,
            priority=batch.priority,
            # Its window while offered (a retry is the same job); else the default one.
            completion_window=batch.completion_window if windows.get(batch.completion_window) else None,
            output_contract=batch.output_contract,
        )
        return create_batch(organization=batch.organization, params=params)
    except BaseException:
        files.delete_file(retry_file)
        raise


def _lines_at(stream, spans):
    # Spans come in line order, so the reads walk the file forward.
    for offset, length in spans:
        stream.seek(offset)
        line = stream.read(length)
        yield line if line.endswith(b"\n") else line + b"\n"


# ---------------------------------------------------------------------------
# Cancel


def _fenced(batch):
    """A second cancel of a batch (or one that lost the race to another): what is left of the first's
    wait (cancel_batch), by the time the first was written."""
    if batch.cancelling_at is None:
        return
    left = lifecycle.CANCEL_FENCE_S - (timezone.now() - batch.cancelling_at).total_seconds()
    if left > 0:
        time.sleep(min(left, lifecycle.CANCEL_FENCE_S))


def cancel_batch(batch):
    """Ask a running batch to stop; return it as it now stands.

    validating / in_progress -> cancelling (an engine stops its records and finishes the cancellation).
    Already cancelling or cancelled: unchanged. Anything else: 409.

    It answers lifecycle.CANCEL_FENCE_S after the commit: every engine sends a call only within half
    of that of reading the batch running (batches.engine.fence), so once a cancel answers, no model
    call of its batch leaves any engine. A batch cancelled while validating never ran: no wait.
    """
    # Each lost race means the status moved forward; there are only so many
    # statuses, so this loop ends.
    for _ in range(len(BatchStatus.choices)):
        if batch.status in CANCELLED_OR_CANCELLING:
            _fenced(batch)
            return batch
        if BatchStatus.CANCELLING not in lifecycle.ALLOWED[batch.status]:
            raise Conflict(f"Cannot cancel a batch with status '{batch.status}'.", code="batch_not_cancellable")
        ran = batch.status == BatchStatus.IN_PROGRESS
        with transaction.atomic():
            cancelled = lifecycle.transition(batch, BatchStatus.CANCELLING)
            if cancelled:
                _announce_on_commit(batch)
        if cancelled:
            if ran:
                time.sleep(lifecycle.CANCEL_FENCE_S)  # from the commit on
            return batch
        batch.refresh_from_db()
    raise Conflict(f"Cannot cancel a batch with status '{batch.status}'.", code="batch_not_cancellable")
