"""Checking the request parameters of the Files routes; each error names its param."""

from files.models import Purpose
from files.selectors import LIST_LIMIT_MAX
from files.services import EXPIRES_AFTER_MAX_S, EXPIRES_AFTER_MIN_S
from openrelay.api.errors import ApiError
from openrelay.api.pagination import parse_limit, parse_order
from openrelay.api.params import invalid_choice, missing_parameter, unknown_parameter

UPLOAD_PURPOSES = (Purpose.BATCH,)
UPLOAD_FIELDS = {"purpose", "expires_after[anchor]", "expires_after[seconds]"}


def upload_purpose(fields):
    unknown = sorted(set(fields) - UPLOAD_FIELDS - {"file"})
    if unknown:
        raise unknown_parameter(unknown[0])
    purpose = fields.get("purpose")
    if not purpose:
        raise missing_parameter("purpose")
    if purpose not in UPLOAD_PURPOSES:
        raise invalid_choice("purpose", purpose, UPLOAD_PURPOSES, "This gateway accepts batch input files only.")
    return purpose


def upload_expires_after(fields):
    """Seconds from expires_after[anchor]/expires_after[seconds], or None when neither is sent."""
    anchor, seconds = fields.get("expires_after[anchor]"), fields.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return None
    if not anchor:
        raise missing_parameter("expires_after[anchor]")
    if not seconds:
        raise missing_parameter("expires_after[seconds]")
    if anchor != "created_at":
        raise invalid_choice("expires_after[anchor]", anchor, ("created_at",))
    try:
        value = int(seconds)
    except ValueError:
        raise ApiError(
            f"Invalid type for 'expires_after[seconds]': expected an integer, but got '{seconds}' instead.",
            param="expires_after[seconds]",
            code="invalid_type",
        ) from None
    if not EXPIRES_AFTER_MIN_S <= value <= EXPIRES_AFTER_MAX_S:
        raise ApiError(
            f"Invalid value for 'expires_after[seconds]': {value}. Expected a value between "
            f"{EXPIRES_AFTER_MIN_S} (1 hour) and {EXPIRES_AFTER_MAX_S} (30 days).",
            param="expires_after[seconds]",
            code="invalid_value",
        )
    return value


def list_params(query):
    """purpose, limit, order, after from the query string of GET /v1/files."""
    return {
        "purpose": query.get("purpose") or None,
        "limit": parse_limit(query.get("limit"), default=LIST_LIMIT_MAX, maximum=LIST_LIMIT_MAX),
        "order": parse_order(query.get("order")),
        "after": query.get("after") or None,
    }
