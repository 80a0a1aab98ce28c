"""Reading a route's JSON body: what the OpenAI SDK, curl and form posts send, with one error each."""

import orjson
from django.conf import settings
from django.core.exceptions import RequestDataTooBig

from openrelay.api.errors import ApiError

JSON_TYPE, FORM_TYPE = "application/json", "application/x-www-form-urlencoded"
SEND_JSON = "Send a JSON object with the header `Content-Type: application/json`"


def json_body(request, max_bytes=None):
    """The request's body parsed as JSON ({} when empty), read whole up to DATA_UPLOAD_MAX_MEMORY_SIZE
    (or `max_bytes`, for a route whose bodies may be larger: Message Batch creates).

    Accepted: `application/json`, no Content-Type, and `application/x-www-form-urlencoded`
    whose body is a JSON object (what `curl -d '{...}'` sends without -H). Otherwise 415,
    400 for malformed JSON (saying where), 413 past the size cap.
    """
    media_type = request.META.get("CONTENT_TYPE", "").split(";")[0].strip().lower()
    if media_type not in ("", JSON_TYPE, FORM_TYPE):
        raise ApiError(
            f"Unsupported Content-Type {media_type[:100]!r}: this route reads a JSON body. {SEND_JSON}.",
            status=415,
            code="unsupported_media_type",
        )
    try:
        raw = request.body if max_bytes is None else _read_up_to(request, max_bytes)
    except RequestDataTooBig:
        raise _too_large(max_bytes) from None
    if not raw.strip():
        return {}
    if media_type == FORM_TYPE and not raw.lstrip().startswith(b"{"):
        raise ApiError(
            f"The body is form data ({FORM_TYPE}), not JSON: this route reads a JSON body. {SEND_JSON} "
            "(curl: -H 'Content-Type: application/json' -d '{...}').",
            status=415,
            code="unsupported_media_type",
        )
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(
            f"We could not parse the JSON body of your request: {exc.msg} at line {exc.lineno}, column "
            f"{exc.colno}. {SEND_JSON}.",
            code="parse_error",
        ) from None


def _read_up_to(request, max_bytes):
    """The body, past Django's own cap (request.body refuses anything over DATA_UPLOAD_MAX_MEMORY_SIZE)."""
    if int(request.META.get("CONTENT_LENGTH") or 0) > max_bytes:
        raise RequestDataTooBig()
    return request._request.read() if hasattr(request, "_request") else request.read()


def _too_large(limit=None):
    if limit is not None:
        return ApiError(
            f"The request body is larger than {limit:,} bytes, this route's limit. Split it into several requests.",
            status=413,
            code="request_too_large",
        )
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return ApiError(
        f"The request body is larger than {limit:,} bytes, the limit for a JSON body. Upload large inputs "
        "as a file (POST /v1/files) and create the batch with its input_file_id.",
        status=413,
        code="request_too_large",
    )
