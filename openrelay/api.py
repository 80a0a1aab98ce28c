"""What the routes of the API share: reading a JSON body, the list `limit`, and content
negotiation for downloads."""

import orjson
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db.models import Q
from rest_framework.negotiation import DefaultContentNegotiation

from openrelay.errors import ApiError
from openrelay.lists import list_object

LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX = 20, 100
JSON_TYPE, FORM_TYPE = "application/json", "application/x-www-form-urlencoded"
SEND_JSON = "Send a JSON object with the header `Content-Type: application/json`"


def json_body(request):
    """The request's body parsed as JSON ({} when empty), read whole up to DATA_UPLOAD_MAX_MEMORY_SIZE.

    Accepted: `application/json`, no Content-Type, and `application/x-www-form-urlencoded`
    whose body is a JSON object (what `curl -d '{...}'` sends without -H). Otherwise 415,
    400 for malformed JSON (saying where), 413 past the size cap.
    """
    media_type = request.META.get("CONTENT_TYPE", "").split(";")[0].strip().lower()
    if media_type not in ("", JSON_TYPE, FORM_TYPE):
        raise ApiError(f"Unsupported Content-Type {media_type[:100]!r}: this route reads a JSON body. {SEND_JSON}.",
                       status=415, code="unsupported_media_type")
    try:
        raw = request.body
    except RequestDataTooBig:
        raise _too_large() from None
    if not raw.strip():
        return {}
    if media_type == FORM_TYPE and not raw.lstrip().startswith(b"{"):
        raise ApiError(f"The body is form data ({FORM_TYPE}), not JSON: this route reads a JSON body. {SEND_JSON} "
                       "(curl: -H 'Content-Type: application/json' -d '{...}').", status=415,
                       code="unsupported_media_type")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(f"We could not parse the JSON body of your request: {exc.msg} at line {exc.lineno}, column "
                       f"{exc.colno}. {SEND_JSON}.", code="parse_error") from None


def _too_large():
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return ApiError(f"The request body is larger than {limit:,} bytes, the limit for a JSON body. Upload large inputs "
                    "as a file (POST /v1/files) and create the batch with its input_file_id.", status=413,
                    code="request_too_large")


def parse_limit(raw):
    """A list route's `limit` query parameter: 1 to LIST_LIMIT_MAX, LIST_LIMIT_DEFAULT when absent."""
    if raw is None or raw == "":
        return LIST_LIMIT_DEFAULT
    try:
        limit = int(raw)
    except ValueError:
        limit = None
    if limit is None or not 1 <= limit <= LIST_LIMIT_MAX:
        raise ApiError(f"Invalid 'limit': expected an integer between 1 and {LIST_LIMIT_MAX}, but got {raw!r} "
                       "instead.", param="limit", code="invalid_value")
    return limit


def newest_first_page(request, queryset, present, noun):
    """A list route's page: `queryset` newest first ((-created_at, -pk), rows with a public_id),
    cut by the `limit` and `after` query parameters, each row `present`ed, in the list envelope."""
    limit = parse_limit(request.query_params.get("limit"))
    rows = queryset.order_by("-created_at", "-pk")
    after = request.query_params.get("after")
    if after:
        cursor = queryset.filter(public_id=after).values("created_at", "pk").first()
        if cursor is None:
            raise ApiError(f"Invalid 'after': no {noun} found with id '{after}'.", param="after", code="invalid_value")
        # Rows strictly after the cursor in that order.
        rows = rows.filter(Q(created_at__lt=cursor["created_at"]) | Q(created_at=cursor["created_at"], pk__lt=cursor["pk"]))
    page = list(rows[: limit + 1])
    return list_object([present(row) for row in page[:limit]], has_more=len(page) > limit)


class IgnoreAcceptNegotiation(DefaultContentNegotiation):
    """The SDK asks for `Accept: application/binary`; bytes are what it gets, errors stay JSON."""

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type
