import logging

import orjson
from django.core.exceptions import RequestDataTooBig
from django.http import Http404

from openrelay.api.errors import error_response, method_not_allowed
from openrelay.lib.ids import new_request_id
from openrelay.web import dialects, hosts

logger = logging.getLogger("openrelay.api")


def _is_api(request):
    return request.path.startswith("/v1/") or request.path == "/v1"


def _has_nul(request):
    query = request.META.get("QUERY_STRING", "")
    return "\x00" in request.path or "%00" in query or "\x00" in query


class RequestIdMiddleware:
    """Every response carries x-request-id (the OpenAI SDK exposes it)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        request.request_id = new_request_id()
        response = self.get_response(request)
        response["x-request-id"] = request.request_id
        return response


class HostRoutingMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if hosts.refused_here(request):
            where = (
                "Organization routes are served by the control-plane host, not the inference host."
                if hosts.is_control_route(request.path)
                else "Batch and file routes are served by the inference host, not the control plane."
            )
            return error_response(
                404, f"Unknown request URL: {request.method} {request.path}. {where}", code="unknown_url"
            )
        return self.get_response(request)


class ApiErrorMiddleware:
    """Turn Django's own 404/405/413/500 answers on /v1/ into the envelope."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if _is_api(request) and _has_nul(request):
            # PostgreSQL text can't hold NUL, so such an id or cursor would
            # fail inside the lookup (a 500); no valid id contains one.
            return error_response(
                400,
                "The request URL contains a NUL character (%00), which no id or parameter may contain.",
                code="invalid_characters",
            )
        response = self.get_response(request)
        if not _is_api(request) or response.get("Content-Type", "").startswith("application/json"):
            return response
        if response.status_code == 404:
            return error_response(404, f"Unknown request URL: {request.method} {request.path}.", code="unknown_url")
        if response.status_code == 405:
            allowed = [m.strip() for m in response.get("Allow", "").split(",") if m.strip()]
            message = method_not_allowed(request.method, request.path, allowed)
            return error_response(405, message, code="method_not_allowed", headers={"Allow": response.get("Allow", "")})
        if response.status_code >= 500:
            return error_response(500, "The server had an error while processing your request.", type="server_error")
        return response

    def process_exception(self, request, exception):
        if not _is_api(request):
            return None
        if isinstance(exception, Http404):
            return error_response(404, f"Unknown request URL: {request.method} {request.path}.", code="unknown_url")
        if isinstance(exception, RequestDataTooBig):
            return error_response(413, "Request body is too large.", code="request_too_large")
        logger.exception("Unhandled error on %s %s", request.method, request.path)
        return error_response(500, "The server had an error while processing your request.", type="server_error")


class DialectErrorMiddleware:
    """Every error answer under a dialect's prefix in its envelope instead of OpenAI's (Anthropic's
    under its Message Batches routes): the views' own, authentication's, throttling's and Django's
    404/405/413/500 alike. The dialects are registered by the apps that serve them (openrelay.web.dialects).

    The routes raise the house's ApiError like every other; reshaping the finished answer
    here keeps one error path for every dialect. Error bodies are small, so re-reading them costs nothing.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if response.status_code < 400:
            return response
        dialect = dialects.owner(request.path)
        if dialect is None or dialect.envelope is None:
            return response
        if not response.get("Content-Type", "").startswith("application/json"):
            return response
        try:
            body = orjson.loads(response.content)
        except orjson.JSONDecodeError:
            return response
        if not isinstance(body, dict) or not isinstance(body.get("error"), dict) or "type" in body:
            return response
        reshaped = dialect.envelope(response.status_code, body["error"], getattr(request, "request_id", None))
        response.content = orjson.dumps(reshaped)
        if response.has_header("Content-Length"):  # set by the middleware inside for the old body
            response["Content-Length"] = str(len(response.content))
        return response
