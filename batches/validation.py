"""Create-time validation: the create request's parameters and every input record.

Two kinds of failure, two answers:
- a bad request (endpoint, metadata, too many records, ...) refuses the
  create with a 400 (`ApiError`, or `FileRejected` for the input file);
- a bad record rejects only that record (`RecordRejected`), listed in the
  batch's `errors` with its 1-based line; the rest run.

`normalize_tool_config` and `normalize_workflow` are also called by the
engine on the body it reads back, so what runs is the clamped value.
"""

from dataclasses import dataclass, field
from urllib.parse import urlsplit

import orjson

from openrelay.api.errors import ApiError
from openrelay.api.params import invalid_type, missing_parameter, request_object, shown, type_name

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/moderations")
# Tool loops and workflows read and extend a chat conversation: no other endpoint has one.
CHAT_ONLY = "/v1/chat/completions"
COMPLETION_WINDOWS = ("24h",)
PRIORITIES = ("standard", "expedited")
MAX_RECORDS = 50_000
MAX_CUSTOM_ID = 512
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512
OUTPUT_EXPIRY_RANGE = (3600, 2_592_000)
MAX_CALLBACK_URL = 2048
# One input line (one request) at most: a record is read whole into memory by
# create and by the worker, and sent whole to the model. 10 MB holds a request
# with several large base64 images; past it the line is rejected, not read.
MAX_LINE_BYTES = 10 * 1024 * 1024
# JSON nesting of one line at most. orjson parses 1024 levels but writes only
# 254, and the worker re-serializes every body it sends (tool loops and
# workflows wrap it a few levels deeper): a deeper line could be accepted and
# then never be sent. Real requests (tool schemas included) stay far below.
MAX_NESTING_DEPTH = 128

CREATE_PARAMS = (
    "input_file_id", "requests", "endpoint", "completion_window", "metadata", "output_expires_after", "priority",
)

# Endpoint -> (the body key that carries the input, its message, the API's name).
BODY_INPUT = {
    "/v1/chat/completions": ("messages", "Messages parameter is required.", "Chat Completions"),
    "/v1/completions": ("prompt", "Prompt parameter is required.", "Completions"),
    "/v1/embeddings": ("input", "Input parameter is required.", "Embeddings"),
    "/v1/responses": ("input", "Input parameter is required.", "Responses"),
    "/v1/moderations": ("input", "Input parameter is required.", "Moderations"),
}
# Endpoint -> {body key: why it cannot work in a batch}. A key set to null (or false) is fine.
UNSUPPORTED_FIELDS = {
    "/v1/responses": {
        "background": "every batch request already runs in the background; leave 'background' out",
        "previous_response_id": "a batch request can't continue a stored response; send the whole conversation "
                                "in 'input'",
        "conversation": "a batch request can't read or extend a stored conversation; send the whole conversation "
                        "in 'input'",
    },
}

# name -> (default, cap). Omitted or 0 takes the default; above the cap is clamped.
TOOL_CONFIG_LIMITS = {"max_rounds": (8, 16), "timeout_ms": (30_000, 120_000)}
WORKFLOW_LIMITS = {
    "max_steps": (8, 64),
    "max_requests": (64, 1024),
    "max_tokens": (1_000_000, 10_000_000),
    "timeout_ms": (30_000, 120_000),
}
TOOL_TYPES = ("http", "mcp")
TOOL_CONFIG_PARAM = "body.openrelay.tool_config"
WORKFLOW_PARAM = "body.openrelay.workflow"
OPENRELAY_KEYS = ("tool_config", "workflow")

INVALID_JSON = "This line is not parseable as valid JSON."
LINE_TOO_LONG = (f"This line is longer than {MAX_LINE_BYTES:,} bytes ({MAX_LINE_BYTES // (1024 * 1024)} MB), the limit "
                 "for one request. Compress or shrink its images, or split its content across several requests.")
TOO_DEEP = (f"This line nests JSON deeper than {MAX_NESTING_DEPTH} levels, the limit for one request.")
NOT_AN_OBJECT = "This line is valid JSON but not a JSON object; each line must be one request object."


class RecordRejected(Exception):
    """One input record is refused; the batch goes on without it."""

    def __init__(self, code, message, param=None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param

    def as_error(self, line):
        return {"code": self.code, "message": self.message, "param": self.param, "line": line}


class FileRejected(Exception):
    """The input as a whole is refused (empty, too many records): the create answers 400."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


def _quoted_list(values):
    quoted = [f"'{v}'" for v in values]
    return ", ".join(quoted[:-1]) + f", and {quoted[-1]}" if len(quoted) > 2 else " and ".join(quoted)


def _invalid_choice(param, value, allowed):
    return ApiError(
        f"Invalid value for '{param}': {shown(value)}. Supported values are: {_quoted_list(allowed)}.",
        param=param, code="invalid_value",
    )


# ---------------------------------------------------------------------------
# The create request


@dataclass(frozen=True)
class CreateParams:
    endpoint: str
    completion_window: str
    input_file_id: str | None = None
    requests: list | None = None
    metadata: dict | None = None
    output_expires_after_s: int | None = None
    priority: str = "standard"


def parse_create_params(data):
    """Check the JSON body of `POST /v1/batches`; raise ApiError (400) on the first problem."""
    request_object(data, CREATE_PARAMS)
    input_file_id, requests = _parse_input(data)
    return CreateParams(
        endpoint=_parse_choice(data, "endpoint", ENDPOINTS),
        completion_window=_parse_choice(data, "completion_window", COMPLETION_WINDOWS),
        input_file_id=input_file_id,
        requests=requests,
        metadata=parse_metadata(data.get("metadata")),
        output_expires_after_s=_parse_output_expiry(data.get("output_expires_after")),
        priority=_parse_choice(data, "priority", PRIORITIES, default="standard"),
    )


def _parse_choice(data, param, allowed, default=None):
    value = data.get(param)
    if value is None:
        if default is None:
            raise missing_parameter(param)
        return default
    if value not in allowed:
        raise _invalid_choice(param, value, allowed)
    return value


def _parse_input(data):
    input_file_id, requests = data.get("input_file_id"), data.get("requests")
    if input_file_id is not None and requests is not None:
        raise ApiError(
            "Provide either 'input_file_id' or inline 'requests', not both.", param="requests", code="invalid_value"
        )
    if input_file_id is None and requests is None:
        raise missing_parameter("input_file_id")
    if input_file_id is not None and not isinstance(input_file_id, str):
        raise invalid_type("input_file_id", "a string", input_file_id)
    if requests is not None and not isinstance(requests, list):
        raise invalid_type("requests", "an array of request objects", requests)
    return input_file_id, requests


def parse_metadata(value):
    """null, or at most 16 string -> string pairs (keys <= 64, values <= 512 characters)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid_type("metadata", "an object", value)
    if len(value) > MAX_METADATA_PAIRS:
        raise ApiError(
            f"Invalid 'metadata': too many properties. Expected an object with at most {MAX_METADATA_PAIRS} "
            f"properties, but got an object with {len(value)} properties instead.",
            param="metadata", code="invalid_value",
        )
    for key, item in value.items():
        if "\x00" in key or isinstance(item, str) and "\x00" in item:
            # Stored as JSON in the database, where PostgreSQL refuses NUL.
            raise ApiError("Invalid 'metadata': keys and values must not contain NUL (\\u0000) characters.",
                           param="metadata", code="invalid_value")
        if len(key) > MAX_METADATA_KEY:
            raise ApiError(
                f"Invalid 'metadata': key '{key[:MAX_METADATA_KEY]}...' is too long. Expected keys of at most "
                f"{MAX_METADATA_KEY} characters, but got {len(key)} characters instead.",
                param="metadata", code="invalid_value",
            )
        if not isinstance(item, str):
            raise invalid_type(f"metadata.{key}", "a string", item)
        if len(item) > MAX_METADATA_VALUE:
            raise ApiError(
                f"Invalid 'metadata.{key}': string too long. Expected a string with maximum length "
                f"{MAX_METADATA_VALUE}, but got a string with length {len(item)} instead.",
                param=f"metadata.{key}", code="invalid_value",
            )
    return value


def _parse_output_expiry(value):
    """`{anchor: "created_at", seconds: 3600..2592000}` -> the seconds, or None."""
    if value is None:
        return None
    param = "output_expires_after"
    if not isinstance(value, dict):
        raise invalid_type(param, "an object", value)
    for key in value:
        if key not in ("anchor", "seconds"):
            raise ApiError(f"Unrecognized request argument supplied: {param}.{key}", param=f"{param}.{key}",
                           code="unknown_parameter")
    anchor, seconds = value.get("anchor"), value.get("seconds")
    if anchor is None:
        raise missing_parameter(f"{param}.anchor")
    if anchor != "created_at":
        raise _invalid_choice(f"{param}.anchor", anchor, ("created_at",))
    if seconds is None:
        raise missing_parameter(f"{param}.seconds")
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        raise invalid_type(f"{param}.seconds", "an integer", seconds)
    low, high = OUTPUT_EXPIRY_RANGE
    if not low <= seconds <= high:
        raise ApiError(
            f"Invalid '{param}.seconds': expected a value between {low} and {high} seconds, but got {seconds} instead.",
            param=f"{param}.seconds", code="invalid_value",
        )
    return seconds


# ---------------------------------------------------------------------------
# OpenRelay's body extensions (also called by the engine at run time)


def normalize_tool_config(value):
    """Check `openrelay.tool_config` and return it with defaults and caps applied.

    The URL is only syntax-checked here; it is resolved and guarded when it is
    called, so a DNS change between create and run can't slip past the guard.
    """
    code, param = "invalid_tool_config", TOOL_CONFIG_PARAM
    _require_object(value, code, param)
    _reject_unknown_keys(value, ("type", "url", "authorization", "context", *TOOL_CONFIG_LIMITS), code, param)
    kind = value.get("type")
    if kind is None:
        kind = "http"
    if kind not in TOOL_TYPES:
        raise RecordRejected(code, f"Invalid value for '{param}.type': {shown(kind)}. Supported values are: "
                                   f"{_quoted_list(TOOL_TYPES)}.", f"{param}.type")
    return {"type": kind, **_callback_fields(value, code, param), **_limits(value, TOOL_CONFIG_LIMITS, code, param)}


def normalize_workflow(value):
    """Check `openrelay.workflow` (workflows.md) and return it with defaults and caps applied."""
    code, param = "invalid_workflow", WORKFLOW_PARAM
    _require_object(value, code, param)
    _reject_unknown_keys(value, ("url", "authorization", "context", *WORKFLOW_LIMITS), code, param)
    return {**_callback_fields(value, code, param), **_limits(value, WORKFLOW_LIMITS, code, param)}


def _wrong_type(code, param, expected, value):
    return RecordRejected(
        code, f"Invalid type for '{param}': expected {expected}, but got {type_name(value)} instead.", param
    )


def _require_object(value, code, param):
    if not isinstance(value, dict):
        raise _wrong_type(code, param, "an object", value)


def _reject_unknown_keys(value, known, code, param):
    # A typo (say "max_round") would otherwise run silently with the default.
    for key in value:
        if key not in known:
            raise RecordRejected(code, f"Unknown parameter '{param}.{key}'.", f"{param}.{key}")


def _callback_fields(value, code, param):
    authorization = value.get("authorization")
    if authorization is not None and not isinstance(authorization, str):
        raise _wrong_type(code, f"{param}.authorization", "a string", authorization)
    return {"url": _check_url(value.get("url"), code, f"{param}.url"), "authorization": authorization,
            "context": value.get("context")}


def _check_url(url, code, param):
    if url is None:
        raise RecordRejected(code, f"Missing required parameter: '{param}'.", param)
    if not isinstance(url, str):
        raise _wrong_type(code, param, "a string", url)
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:
        host, parts = None, None
    if (parts is None or parts.scheme not in ("http", "https") or not host or len(url) > MAX_CALLBACK_URL
            or any(ch.isspace() for ch in url)):
        raise RecordRejected(code, f"Invalid '{param}': expected an absolute http(s) URL with a host "
                                   f"(at most {MAX_CALLBACK_URL} characters).", param)
    return url


def _limits(value, limits, code, param):
    return {name: _bounded_int(value.get(name), *limits[name], code, f"{param}.{name}") for name in limits}


def _is_integral(value):
    # JSON has one number type, so 8.0 counts as the integer 8; booleans don't.
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or isinstance(value, float) and value.is_integer()


def _bounded_int(value, default, cap, code, param):
    if value is None or _is_integral(value) and value == 0:
        return default
    if not _is_integral(value):
        raise _wrong_type(code, param, "an integer", value)
    if value < 0:
        raise RecordRejected(code, f"Invalid '{param}': expected a non-negative integer, but got {value} instead.",
                             param)
    return min(int(value), cap)


# ---------------------------------------------------------------------------
# Records


class RecordChecker:
    """Checks records one at a time, remembering the batch's model and the custom_ids taken.

    Checks run in a fixed order so a line with several problems always gets
    the same answer: JSON -> required params -> custom_id -> method/url ->
    body shape -> stream -> model -> openrelay extensions -> duplicate
    custom_id. Only accepted records claim their custom_id and, for the
    first one, the batch's model.
    """

    def __init__(self, endpoint, *, models, workflows_enabled):
        self.endpoint = endpoint
        self.models = models  # enabled catalog names -> Model pk
        self.workflows_enabled = workflows_enabled
        self.model_name = None
        self.seen = {}  # custom_id -> line of the accepted record that took it

    @property
    def model_pk(self):
        return self.models.get(self.model_name)

    def check(self, obj, line):
        """Return the record's custom_id, or raise RecordRejected."""
        if not isinstance(obj, dict):
            raise RecordRejected("invalid_json_line", NOT_AN_OBJECT)
        for key in ("custom_id", "method", "url", "body"):
            if obj.get(key) is None:
                raise RecordRejected("missing_required_parameter", f"Missing required parameter: '{key}'.", key)
        custom_id, body = obj["custom_id"], obj["body"]
        _check_custom_id(custom_id)
        self._check_target(obj["method"], obj["url"])
        self._check_body_shape(body)
        self._check_stream(body)
        self._check_supported(body)
        model = self._check_model(body["model"])
        self._check_extensions(body)
        self._claim(custom_id, model, line)
        return custom_id

    def _check_target(self, method, url):
        if method != "POST":
            raise RecordRejected("invalid_request", f"Invalid value for 'method': {shown(method)}. Only 'POST' is "
                                                    "supported.", "method")
        if url != self.endpoint:
            raise RecordRejected("invalid_url", "The URL provided for this request does not match the batch endpoint.",
                                 "url")

    def _check_body_shape(self, body):
        if not isinstance(body, dict):
            raise _wrong_type("invalid_request", "body", "an object", body)
        model = body.get("model")
        if model is None or model == "":
            raise RecordRejected("invalid_request", "Model parameter is required.", "body.model")
        if not isinstance(model, str):
            raise _wrong_type("invalid_request", "body.model", "a string", model)
        key, message, _ = BODY_INPUT[self.endpoint]
        value = body.get(key)
        accepted = (list,) if key == "messages" else (list, str)
        if not isinstance(value, accepted) or not value:
            raise RecordRejected("invalid_request", message, f"body.{key}")

    def _check_stream(self, body):
        if body.get("stream") not in (None, False):
            name = BODY_INPUT[self.endpoint][2]
            raise RecordRejected("streaming_unsupported", f"{name}: Streaming is not supported in the Batch API.",
                                 "body.stream")

    def _check_supported(self, body):
        for key, why in UNSUPPORTED_FIELDS.get(self.endpoint, {}).items():
            if body.get(key) not in (None, False):
                name = BODY_INPUT[self.endpoint][2]
                raise RecordRejected("unsupported_parameter", f"{name}: '{key}' is not supported in the Batch API: "
                                                              f"{why}.", f"body.{key}")

    def _check_model(self, model):
        if model not in self.models:
            raise RecordRejected("model_not_found", f"The provided model '{model}' is not supported by the Batch API.",
                                 "body.model")
        if self.model_name is not None and model != self.model_name:
            raise RecordRejected(
                "model_mismatch", f"The provided model '{model}' does not match this batch's model "
                                  f"'{self.model_name}'; a batch runs a single model.", "body.model",
            )
        return model

    def _check_extensions(self, body):
        if "tool_config" in body:
            raise RecordRejected("tool_config_moved", "'tool_config' is no longer accepted at the top of the body; "
                                                      "move it to 'openrelay.tool_config'.", "body.tool_config")
        extensions = body.get("openrelay")
        if extensions is None:
            return
        if not isinstance(extensions, dict):
            raise _wrong_type("invalid_request", "body.openrelay", "an object", extensions)
        for key in extensions:
            if key not in OPENRELAY_KEYS:
                raise RecordRejected("invalid_request", f"Unknown parameter 'body.openrelay.{key}'.",
                                     f"body.openrelay.{key}")
        self._check_tool_or_workflow(extensions)

    def _check_tool_or_workflow(self, extensions):
        if "tool_config" in extensions and "workflow" in extensions:
            raise RecordRejected("invalid_workflow", "A record can carry 'openrelay.workflow' or "
                                                     "'openrelay.tool_config', not both.", "body.openrelay")
        if "tool_config" in extensions:
            if self.endpoint != CHAT_ONLY:
                raise RecordRejected("invalid_tool_config", f"'openrelay.tool_config' is only supported on "
                                                            f"{CHAT_ONLY}.", TOOL_CONFIG_PARAM)
            normalize_tool_config(extensions["tool_config"])
        if "workflow" in extensions:
            if self.endpoint != CHAT_ONLY:
                raise RecordRejected("invalid_workflow", f"'openrelay.workflow' is only supported on {CHAT_ONLY}.",
                                     WORKFLOW_PARAM)
            if not self.workflows_enabled:
                raise RecordRejected("workflow_not_enabled", "Workflows are not enabled for this organization.",
                                     WORKFLOW_PARAM)
            normalize_workflow(extensions["workflow"])

    def _claim(self, custom_id, model, line):
        first = self.seen.get(custom_id)
        if first is not None:
            raise RecordRejected("duplicate_custom_id", f"The custom_id '{custom_id}' is already used by the request "
                                                        f"on line {first}; custom_id must be unique.", "custom_id")
        self.seen[custom_id] = line
        if self.model_name is None:
            self.model_name = model


def _check_custom_id(custom_id):
    # NUL: custom_id is a database column, and PostgreSQL text can't hold one.
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > MAX_CUSTOM_ID or "\x00" in custom_id:
        raise RecordRejected("invalid_request", f"Invalid 'custom_id': expected a non-empty string of at most "
                                                f"{MAX_CUSTOM_ID} characters (no NUL).", "custom_id")


# ---------------------------------------------------------------------------
# The streaming pass


@dataclass
class ScanResult:
    """Accepted records as parallel columns (compact for 50,000 rows) and the rejections."""

    lines: list = field(default_factory=list)
    custom_ids: list = field(default_factory=list)
    offsets: list = field(default_factory=list)
    lengths: list = field(default_factory=list)
    errors: list = field(default_factory=list)

    @property
    def accepted(self):
        return len(self.lines)

    def rows(self):
        """(line, custom_id, offset, length) per accepted record."""
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
    return (f"The input contains more than {limit:,} requests; a batch holds at most {limit:,}. "
            "Split it into several batches.")


def scan(stream, checker, *, max_records=MAX_RECORDS):
    """One pass over the input: check each non-blank line, return a ScanResult.

    Blank lines are not records but keep their line numbers. Raises
    FileRejected for an input with no records or more than `max_records`
    (stopping as soon as the limit is passed).
    """
    result, records = ScanResult(), 0
    for number, (offset, raw) in enumerate(iter_lines(stream, max_line=MAX_LINE_BYTES), start=1):
        if raw is None:
            records += 1
            if records > max_records:
                raise FileRejected("too_many_requests", too_many_message(max_records))
            result.errors.append(RecordRejected("line_too_long", LINE_TOO_LONG).as_error(number))
            continue
        if number == 1 and raw.startswith(_BOM):
            # Editors on Windows add a BOM; skip it so the stored offset is clean JSON.
            offset, raw = offset + len(_BOM), raw[len(_BOM):]
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
    result.lines.append(number)
    result.custom_ids.append(custom_id)
    result.offsets.append(offset)
    result.lengths.append(len(raw))


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
