"""DRF's exception handler: ApiError and DRF's own exceptions in the one error envelope."""

import logging
import sys

from rest_framework import exceptions as drf_exceptions
from rest_framework.response import Response

from openrelay.api.errors import ApiError, StorageUnavailable, envelope, error_type, method_not_allowed

logger = logging.getLogger("openrelay.api")


def _drf_message(detail):
    """Flatten DRF's nested validation detail into (message, param)."""
    if isinstance(detail, dict):
        field, value = next(iter(detail.items()))
        message, inner = _drf_message(value)
        param = field if inner is None else f"{field}.{inner}"
        return message, (None if field == "non_field_errors" else param)
    if isinstance(detail, list) and detail:
        return _drf_message(detail[0])
    return str(detail), None


def api_exception_handler(exc, context):
    if _storage_unavailable(exc):
        # The error's text can name the endpoint and bucket: the log gets it, the client doesn't.
        logger.warning("file storage unavailable: %s: %s", type(exc).__name__, exc)
        exc = StorageUnavailable()
    if isinstance(exc, ApiError):
        return Response(exc.envelope(), status=exc.status, headers=exc.headers)
    if isinstance(exc, drf_exceptions.MethodNotAllowed):
        view, request = context["view"], context["request"]
        message = method_not_allowed(
            request.method, request.path, view.allowed_methods, getattr(view, "method_hint", None)
        )
        return Response(envelope(message, param=None, code="method_not_allowed"), status=405)
    if isinstance(exc, drf_exceptions.APIException):
        status = exc.status_code
        if isinstance(exc, (drf_exceptions.NotAuthenticated, drf_exceptions.AuthenticationFailed)):
            status = 401
        message, param = _drf_message(exc.detail)
        code = getattr(exc, "default_code", None) if status != 400 else _drf_code(exc.detail)
        if isinstance(exc, drf_exceptions.NotAuthenticated):
            code = "missing_api_key"
        elif isinstance(exc, drf_exceptions.AuthenticationFailed):
            code = "invalid_api_key"
        headers = {}
        if isinstance(exc, drf_exceptions.Throttled) and exc.wait:
            headers["Retry-After"] = str(int(exc.wait) + 1)
        return Response(
            envelope(message, type=error_type(status), param=param, code=code), status=status, headers=headers
        )
    return None


def _drf_code(detail):
    if isinstance(detail, dict):
        return _drf_code(next(iter(detail.values())))
    if isinstance(detail, list) and detail:
        return _drf_code(detail[0])
    code = getattr(detail, "code", None)
    return {"invalid": "invalid_value", "required": "missing_required_parameter"}.get(code, code)


def _storage_unavailable(exc):
    """Does `exc` say the S3 store is down or hung (files.storage: connect and read timeouts, bounded
    attempts), rather than a mistake of ours? Only botocore talks to a store, so its error says so."""
    if "botocore" not in sys.modules:
        return False  # nothing has talked to S3 in this process
    from botocore.exceptions import ClientError, ConnectionError, HTTPClientError

    if isinstance(exc, (ConnectionError, HTTPClientError)):  # refused, DNS, connect and read timeouts, resets
        return True
    if isinstance(exc, ClientError):  # the store's own 5xx (500, 503 SlowDown)
        return exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) >= 500
    return False
