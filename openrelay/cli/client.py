"""The API over HTTP: the Client (httpx), the errors every command ends with, and the exit codes.

Everything that talks to the server goes through Client.call or Client.stream, which raise
CliError subclasses (ApiFailure for a non-2xx answer, Unreachable for a transport error) and never
httpx errors, so the root group (app.py) can turn any of them into stderr text and an exit code.
"""

from __future__ import annotations

from contextlib import contextmanager
from importlib import metadata as importlib_metadata
from urllib.parse import quote

import httpx

EXIT_API_ERROR, EXIT_USAGE, EXIT_BATCH_UNSUCCESSFUL = 1, 2, 3
# Uploads of 200 MB and creates that scan 50,000 records take a while; a
# dead host should still fail fast.
TIMEOUT = httpx.Timeout(120.0, connect=10.0)


# ---------------------------------------------------------------------------
# Errors


class CliError(Exception):
    """Ends the command: the message goes to stderr and the process exits with `exit_code`."""

    def __init__(self, message, exit_code=EXIT_API_ERROR, details=()):
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.details = tuple(details)
        self.transient = False


class ApiFailure(CliError):
    """A non-2xx answer, shown from the API's error envelope."""

    def __init__(self, method, url, status, error):
        self.status = status
        self.error = error
        details = [
            f"HTTP {status}  type: {error.get('type') or '-'}  code: {error.get('code') or '-'}  "
            f"param: {error.get('param') or '-'}",
            f"{method} {url}",
        ]
        super().__init__(error.get("message") or f"HTTP {status}", details=details)
        self.transient = status == 429 or status >= 500

    @classmethod
    def from_response(cls, response):
        try:
            error = response.json()["error"]
            if not isinstance(error, dict):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            # Not our envelope: a proxy's error page, or a base URL that points elsewhere.
            error = {
                "message": f"HTTP {response.status_code} without an API error body; is the base URL right "
                f"(it ends in /v1)? The answer began: {response.text[:120]!r}"
            }
        return cls(response.request.method, response.request.url, response.status_code, error)


class Unreachable(CliError):
    def __init__(self, method, url, exc):
        reason = str(exc) or type(exc).__name__
        super().__init__(f"Could not reach {url} ({method}): {reason}")
        self.transient = True


# ---------------------------------------------------------------------------
# HTTP


class Client:
    """The API over one httpx connection pool; raises CliError subclasses, never httpx errors."""

    def __init__(self, base_url, api_key):
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.base_url + "/",
            headers={"Authorization": f"Bearer {api_key}", "User-Agent": f"orl/{_version()}"},
            timeout=TIMEOUT,
        )

    def close(self):
        self._http.close()

    def call(self, method, path, **kwargs):
        """One request; the decoded JSON body of a 2xx answer."""
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise Unreachable(method, self._url(path), exc) from None
        if response.is_error:
            raise ApiFailure.from_response(response)
        try:
            return response.json()
        except ValueError:
            raise ApiFailure(
                method,
                response.request.url,
                response.status_code,
                {
                    "message": "The server answered with something that is not JSON; is the base URL "
                    "right (it ends in /v1)?"
                },
            ) from None

    @contextmanager
    def stream(self, path):
        """A GET whose body is read in chunks by the caller (downloads are never held in memory)."""
        try:
            with self._http.stream("GET", path) as response:
                if response.is_error:
                    response.read()  # an error body is a small JSON envelope
                    raise ApiFailure.from_response(response)
                yield response
        except httpx.TransportError as exc:
            raise Unreachable("GET", self._url(path), exc) from None

    def _url(self, path):
        return f"{self.base_url}/{path}"


def _version():
    try:
        return importlib_metadata.version("openrelay-batch")
    except importlib_metadata.PackageNotFoundError:
        return "dev"


def _segment(value):
    # An id is one path segment: "../x" must not walk to another route.
    return quote(value, safe="")
