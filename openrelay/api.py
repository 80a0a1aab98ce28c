"""What the routes of the API share: the JSON body parser, reading the body, the list `limit`,
and content negotiation for downloads."""

import orjson
from rest_framework.exceptions import ParseError
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.parsers import JSONParser

from openrelay.errors import ApiError

LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX = 20, 100


class OrjsonParser(JSONParser):
    """JSON bodies through orjson: fast on 10 MB of inline requests, and its
    depth limit answers a 400 where the stdlib parser recurses into a 500."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            return orjson.loads(stream.read())
        except orjson.JSONDecodeError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None


def json_body(request):
    # DRF's parser streams the body without Django's size check; reading
    # request.body first enforces DATA_UPLOAD_MAX_MEMORY_SIZE (a 413).
    request.body  # noqa: B018
    return request.data


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


class IgnoreAcceptNegotiation(DefaultContentNegotiation):
    """The SDK asks for `Accept: application/binary`; bytes are what it gets, errors stay JSON."""

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type
