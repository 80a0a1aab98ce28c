"""Scanning the input file line by line: `scan` reads the JSONL in fixed-size
chunks (`iter_lines`), parses each non-blank line with orjson and hands it to
the record checker; it returns the accepted records (line, custom_id, offset,
length) and the rejections by 1-based line, and refuses the file whole
(`FileRejected`) when it holds no record or too many.
"""

from dataclasses import dataclass, field

import orjson

from batches.validation.extensions import RecordRejected

MAX_RECORDS = 50_000
# One input line (one request) at most: a record is read whole into memory by
# create and by the worker, and sent whole to the model. 10 MB holds a request
# with several large base64 images; past it the line is rejected, not read.
MAX_LINE_BYTES = 10 * 1024 * 1024
# JSON nesting of one line at most. orjson parses 1024 levels but writes only
# 254, and the worker re-serializes every body it sends (tool loops and
# workflows wrap it a few levels deeper): a deeper line could be accepted and
# then never be sent. Real requests (tool schemas included) stay far below.
MAX_NESTING_DEPTH = 128

INVALID_JSON = "This line is not parseable as valid JSON."
LINE_TOO_LONG = (
    f"This line is longer than {MAX_LINE_BYTES:,} bytes ({MAX_LINE_BYTES // (1024 * 1024)} MB), the limit "
    "for one request. Compress or shrink its images, or split its content across several requests."
)
TOO_DEEP = f"This line nests JSON deeper than {MAX_NESTING_DEPTH} levels, the limit for one request."


class FileRejected(Exception):
    """The input as a whole is refused (empty, too many records): the create answers 400."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class ScanResult:
    """Accepted records as parallel columns (compact for 50,000 rows) and the rejections.

    With a `sink`, each accepted record goes to it as (line, custom_id,
    offset, length) instead, as soon as it is checked, and none is kept.
    """

    lines: list = field(default_factory=list)
    custom_ids: list = field(default_factory=list)
    offsets: list = field(default_factory=list)
    lengths: list = field(default_factory=list)
    errors: list = field(default_factory=list)
    sink: object = None
    accepted: int = 0
    accepted_bytes: int = 0  # the accepted lines' bytes (admission approximates their tokens)

    def add(self, line, custom_id, offset, length):
        self.accepted += 1
        self.accepted_bytes += length
        if self.sink is not None:
            self.sink((line, custom_id, offset, length))
            return
        self.lines.append(line)
        self.custom_ids.append(custom_id)
        self.offsets.append(offset)
        self.lengths.append(length)

    def rows(self):
        """(line, custom_id, offset, length) per accepted record (none when they went to a sink)."""
        return zip(self.lines, self.custom_ids, self.offsets, self.lengths)


def iter_lines(stream, chunk_size=1 << 20, max_line=None):
    """Yield (byte offset, line bytes without its newline) from a binary stream.

    Reads fixed-size chunks, so memory is one chunk plus the longest line; a
    line that spans chunks is joined once (no quadratic re-concatenation).
    A line longer than `max_line` bytes is yielded as (offset, None) and never
    held: its bytes are dropped as they go by.
    """
    parts, size, too_long, line_start, chunk_start = [], 0, False, 0, 0
    while chunk := stream.read(chunk_size):
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            piece = chunk[start:end]
            if too_long or (max_line is not None and size + len(piece) > max_line):
                yield line_start, None
            elif parts:
                parts.append(piece)
                yield line_start, b"".join(parts)
            else:
                yield line_start, piece
            parts, size, too_long = [], 0, False
            start = end + 1
            line_start = chunk_start + start
        if start < len(chunk) and not too_long:
            size += len(chunk) - start
            if max_line is not None and size > max_line:
                parts, too_long = [], True
            else:
                parts.append(chunk[start:])
        chunk_start += len(chunk)
    if too_long:
        yield line_start, None
    elif parts:
        yield line_start, b"".join(parts)


_BOM = b"\xef\xbb\xbf"


def too_many_message(limit):
    return (
        f"The input contains more than {limit:,} requests; a batch holds at most {limit:,}. "
        "Split it into several batches."
    )


def scan(stream, checker, *, max_records=MAX_RECORDS, sink=None):
    """One pass over the input: check each non-blank line, return a ScanResult
    (whose accepted records went to `sink` as they came, if given).

    Blank lines are not records but keep their line numbers. Raises
    FileRejected for an input with no records or more than `max_records`
    (stopping as soon as the limit is passed).
    """
    result, records = ScanResult(sink=sink), 0
    for number, (offset, raw) in enumerate(iter_lines(stream, max_line=MAX_LINE_BYTES), start=1):
        if raw is None:
            records += 1
            if records > max_records:
                raise FileRejected("too_many_requests", too_many_message(max_records))
            result.errors.append(RecordRejected("line_too_long", LINE_TOO_LONG).as_error(number))
            continue
        if number == 1 and raw.startswith(_BOM):
            # Editors on Windows add a BOM; skip it so the stored offset is clean JSON.
            offset, raw = offset + len(_BOM), raw[len(_BOM) :]
        if not raw or raw.isspace():
            continue
        records += 1
        if records > max_records:
            raise FileRejected("too_many_requests", too_many_message(max_records))
        _scan_line(result, checker, number, offset, raw)
    if not records:
        raise FileRejected("empty_file", "The input contains no requests.")
    return result


def _scan_line(result, checker, number, offset, raw):
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        # orjson stops at 1024 levels ("depth limit exceeded"): too deep, not malformed.
        too_deep = "depth limit" in str(exc)
        code, message = ("nesting_too_deep", TOO_DEEP) if too_deep else ("invalid_json_line", INVALID_JSON)
        result.errors.append(RecordRejected(code, message).as_error(number))
        return
    if _too_deep(raw, obj):
        result.errors.append(RecordRejected("nesting_too_deep", TOO_DEEP).as_error(number))
        return
    try:
        custom_id = checker.check(obj, number)
    except RecordRejected as rejected:
        result.errors.append(rejected.as_error(number))
        return
    result.add(number, custom_id, offset, len(raw))


def _too_deep(raw, obj, limit=MAX_NESTING_DEPTH):
    """Does `obj` (parsed from `raw`) nest containers deeper than `limit`?

    Only a line with more than `limit` brackets can, so the common line costs
    two byte counts; the walk is iterative (no recursion limit to hit).
    """
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    stack = [(obj, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > limit:
            return True
        children = value.values() if isinstance(value, dict) else value
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False
