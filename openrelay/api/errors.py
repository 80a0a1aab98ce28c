"""The one error envelope: {"error": {"message", "type", "param", "code"}}.

Domain code raises ApiError (or a subclass); DRF's own exceptions (openrelay.api.handlers) and
Django's 404/405/413/500 on /v1/ routes (openrelay.web.middleware) are turned into the same shape.
No DRF here: the engine may import no DRF module (an import contract), and reaches this one through
files.services, which reads its input lines and stores its result files.
"""

from django.http import JsonResponse

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "invalid_request_error",
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


class StorageUnavailable(ApiError):
    """The object store holding files is down or hung (openrelay.api.handlers tells it from botocore's errors)."""

    status = 503

    def __init__(self):
        super().__init__(
            "File storage is not reachable right now; nothing was stored or changed. Try again in a few seconds.",
            code="storage_unavailable",
            headers={"Retry-After": "5"},
        )


def envelope(message, *, type="invalid_request_error", param=None, code=None):
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def error_response(status, message, *, param=None, code=None, type=None, headers=None):
    response = JsonResponse(envelope(message, type=type or error_type(status), param=param, code=code), status=status)
    for name, value in (headers or {}).items():
        response[name] = value
    return response


# Anthropic's error types by status (what its SDK and clients read; https status -> type).
_ANTHROPIC_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def anthropic_error_type(status):
    return _ANTHROPIC_TYPE_BY_STATUS.get(status, "api_error" if status >= 500 else "invalid_request_error")


def anthropic_envelope(status, error, request_id=None):
    """Our envelope's `error` object in Anthropic's: {"type": "error", "error": {"type", "message"}, "request_id"}.
    OpenRelay's `code` and `param` ride along inside `error` (Anthropic's clients ignore what they don't know)."""
    inner = {"type": anthropic_error_type(status), "message": error.get("message", "")}
    for name in ("code", "param"):
        if error.get(name) is not None:
            inner[name] = error[name]
    return {"type": "error", "error": inner, "request_id": request_id}


def method_not_allowed(method, path, allowed, hint=None):
    """The 405 message: which methods the route does serve, and how to do what was likely meant."""
    served = ", ".join(m for m in allowed if m not in ("HEAD", "OPTIONS"))
    return f"Method {method} is not allowed on {path}; it serves {served}." + (f" {hint}" if hint else "")
