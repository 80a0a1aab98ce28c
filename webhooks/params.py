"""The JSON bodies of the webhook endpoint routes, checked into plain values (400 on the first problem)."""

from django.conf import settings

from openrelay.api.errors import ApiError
from openrelay.api.params import invalid_type, missing_parameter, request_object
from openrelay.lib.outbound import OutboundError, check_url
from openrelay.lib.wording import shown
from webhooks.models import EVENT_TYPES

ENDPOINT_FIELDS = ("name", "url", "event_types")
MAX_NAME, MAX_URL = 200, 2048


def parse_endpoint(data, *, partial=False):
    """{name, url, event_types} for create (all required) or update (any of them)."""
    data = request_object(data, ENDPOINT_FIELDS)
    parsed = {}
    for field in ENDPOINT_FIELDS:
        if field not in data:  # a null is a value of the wrong type, not a field left out
            if not partial:
                raise missing_parameter(field)
            continue
        parsed[field] = _PARSERS[field](data[field])
    return parsed


def parse_rotate(data):
    data = request_object(data or {}, ("keep_old_secret_active_for_24_hours",))
    keep = data.get("keep_old_secret_active_for_24_hours", False)
    if keep is None:
        return False
    if not isinstance(keep, bool):
        raise invalid_type("keep_old_secret_active_for_24_hours", "a boolean", keep)
    return keep


def parse_test(data):
    data = request_object(data, ("event_type",))
    if "event_type" not in data:
        raise missing_parameter("event_type")
    return _event_type(data["event_type"], "event_type")


def _name(value):
    if not isinstance(value, str):
        raise invalid_type("name", "a string", value)
    if not value.strip() or len(value) > MAX_NAME or "\x00" in value:
        raise ApiError(f"Invalid 'name': expected 1 to {MAX_NAME} characters.", param="name", code="invalid_value")
    return value


def _url(value):
    if not isinstance(value, str):
        raise invalid_type("url", "a string", value)
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
        raise invalid_type("event_types", "an array", value)
    if not value:
        raise ApiError(
            "Invalid 'event_types': list at least one event type.", param="event_types", code="invalid_value"
        )
    types = [_event_type(item, f"event_types[{index}]") for index, item in enumerate(value)]
    return list(dict.fromkeys(types))  # in the order given, once each


def _event_type(value, param):
    if value not in EVENT_TYPES:
        supported = ", ".join(f"'{t}'" for t in EVENT_TYPES)
        raise ApiError(
            f"Invalid value for '{param}': {shown(value)}. This gateway sends batch events only; "
            f"supported values are: {supported}.",
            param=param,
            code="invalid_value",
        )
    return value


_PARSERS = {"name": _name, "url": _url, "event_types": _event_types}
