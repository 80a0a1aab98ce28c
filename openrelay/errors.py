"""The one error envelope: {"error": {"message", "type", "param", "code"}}.

Domain code raises ApiError (or a subclass); DRF's own exceptions and
Django's 404/405/413/500 on /v1/ routes are turned into the same shape.
"""

from django.http import JsonResponse
from rest_framework import exceptions as drf_exceptions
from rest_framework.response import Response

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
}


def error_type(status):
    return _TYPE_BY_STATUS.get(status, "server_error" if status >= 500 else "invalid_request_error")


class ApiError(Exception):
    status = 400

    def __init__(self, message, *, param=None, code=None, status=None, type=None, headers=None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        if status is not None:
            self.status = status
        self.type = type or error_type(self.status)
        self.headers = headers or {}

    def envelope(self):
        return envelope(self.message, type=self.type, param=self.param, code=self.code)


class NotFound(ApiError):
    status = 404


class Conflict(ApiError):
    """A final conflict: tell the OpenAI SDK not to retry it (it retries 409s)."""

    status = 409

    def __init__(self, message, **kwargs):
        kwargs.setdefault("headers", {"x-should-retry": "false"})
        super().__init__(message, **kwargs)


def envelope(message, *, type="invalid_request_error", param=None, code=None):
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def error_response(status, message, *, param=None, code=None, type=None, headers=None):
    response = JsonResponse(envelope(message, type=type or error_type(status), param=param, code=code), status=status)
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def method_not_allowed(method, path, allowed, hint=None):
    """The 405 message: which methods the route does serve, and how to do what was likely meant."""
    served = ", ".join(m for m in allowed if m not in ("HEAD", "OPTIONS"))
    return f"Method {method} is not allowed on {path}; it serves {served}." + (f" {hint}" if hint else "")


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
    if isinstance(exc, ApiError):
        return Response(exc.envelope(), status=exc.status, headers=exc.headers)
    if isinstance(exc, drf_exceptions.MethodNotAllowed):
        view, request = context["view"], context["request"]
        message = method_not_allowed(request.method, request.path, view.allowed_methods, getattr(view, "method_hint", None))
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
        return Response(envelope(message, type=error_type(status), param=param, code=code), status=status, headers=headers)
    return None


def _drf_code(detail):
    if isinstance(detail, dict):
        return _drf_code(next(iter(detail.values())))
    if isinstance(detail, list) and detail:
        return _drf_code(detail[0])
    code = getattr(detail, "code", None)
    return {"invalid": "invalid_value", "required": "missing_required_parameter"}.get(code, code)
