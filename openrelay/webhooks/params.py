"""The JSON bodies of the webhook endpoint routes, checked into plain values (400 on the first problem)."""

from django.conf import settings

from batches.validation import shown, type_name
from openrelay.errors import ApiError
from openrelay.outbound import OutboundError, check_url
from openrelay.webhooks.models import EVENT_TYPES

ENDPOINT_FIELDS = ("name", "url", "event_types")
MAX_NAME, MAX_URL = 200, 2048


def parse_endpoint(data, *, partial=False):
    """{name, url, event_types} for create (all required) or update (any of them)."""
    data = _object(data, ENDPOINT_FIELDS)
    parsed = {}
    for field in ENDPOINT_FIELDS:
        if field not in data or (partial and data[field] is None):
            if not partial:
                raise ApiError(f"Missing required parameter: '{field}'.", param=field,
                               code="missing_required_parameter")
            continue
        parsed[field] = _PARSERS[field](data[field])
    return parsed


def parse_rotate(data):
    data = _object(data or {}, ("keep_old_secret_active_for_24_hours",))
    keep = data.get("keep_old_secret_active_for_24_hours", False)
    if keep is None:
        return False
    if not isinstance(keep, bool):
        raise _invalid_type("keep_old_secret_active_for_24_hours", "a boolean", keep)
    return keep


def parse_test(data):
    data = _object(data, ("event_type",))
    if "event_type" not in data:
        raise ApiError("Missing required parameter: 'event_type'.", param="event_type",
                       code="missing_required_parameter")
    return _event_type(data["event_type"], "event_type")


def _object(data, known):
    if not isinstance(data, dict):
        raise ApiError(f"The request body must be a JSON object, but got {type_name(data)} instead.",
                       code="invalid_type")
    for key in data:
        if key not in known:
            raise ApiError(f"Unrecognized request argument supplied: {key}", param=key, code="unknown_parameter")
    return data


def _name(value):
    if not isinstance(value, str):
        raise _invalid_type("name", "a string", value)
    if not value.strip() or len(value) > MAX_NAME or "\x00" in value:
        raise ApiError(f"Invalid 'name': expected 1 to {MAX_NAME} characters.", param="name", code="invalid_value")
    return value


def _url(value):
    if not isinstance(value, str):
        raise _invalid_type("url", "a string", value)
    if len(value) > MAX_URL:
        raise ApiError(f"Invalid 'url': longer than {MAX_URL} characters.", param="url", code="invalid_value")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        # Never a valid URL, and PostgreSQL can't even store a NUL.
        raise ApiError("Invalid 'url': it contains a control character.", param="url", code="invalid_url")
    try:
        check_url(value, allow_private=settings.OPENRELAY_ALLOW_PRIVATE_URLS)
    except OutboundError as exc:  # BlockedURL: a private address, a bad scheme, credentials...
        raise ApiError(f"Invalid 'url': {exc.message}", param="url", code="invalid_url") from None
    return value


def _event_types(value):
    if not isinstance(value, list):
        raise _invalid_type("event_types", "an array", value)
    if not value:
        raise ApiError("Invalid 'event_types': list at least one event type.", param="event_types",
                       code="invalid_value")
    types = [_event_type(item, f"event_types[{index}]") for index, item in enumerate(value)]
    return list(dict.fromkeys(types))  # in the order given, once each


def _event_type(value, param):
    if value not in EVENT_TYPES:
        supported = ", ".join(f"'{t}'" for t in EVENT_TYPES)
        raise ApiError(f"Invalid value for '{param}': {shown(value)}. This gateway sends batch events only; "
                       f"supported values are: {supported}.", param=param, code="invalid_value")
    return value


def _invalid_type(param, expected, value):
    return ApiError(f"Invalid type for '{param}': expected {expected}, but got {type_name(value)} instead.",
                    param=param, code="invalid_type")


_PARSERS = {"name": _name, "url": _url, "event_types": _event_types}
