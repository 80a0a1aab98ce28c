"""Liveness and readiness probes: GET /healthz and /readyz, for load balancers and Kubernetes.

/healthz says the process answers requests (it touches nothing else, so a
database outage never gets web processes restarted). /readyz says this
process can serve: the database answers a query and the task broker a ping;
otherwise 503 naming what is not reachable, never why (an error's text can
hold hosts, users or paths), which goes to the log instead.

Answered by a middleware ahead of every other one: a probe carries the
pod's IP as its Host, which ALLOWED_HOSTS may refuse, and it needs no
session, CSRF or host routing.
"""

import logging

from django.db import connections
from django.http import JsonResponse

logger = logging.getLogger("openrelay.probes")

PATHS = ("/healthz", "/readyz")


def database_ready():
    connection = connections["default"]
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
        return True
    except Exception as exc:  # noqa: BLE001 - any driver's error means "not ready"
        logger.warning("readiness: the database is not reachable: %s", type(exc).__name__)
        # A broken connection must not be reused by the next request of this thread.
        connection.close_if_unusable_or_obsolete()
        return False


def broker_ready():
    from django_q.brokers import get_broker

    try:
        return get_broker().ping() is not False
    except Exception as exc:  # noqa: BLE001 - any broker's error means "not ready"
        logger.warning("readiness: the task broker is not reachable: %s", type(exc).__name__)
        return False


CHECKS = {"database": database_ready, "broker": broker_ready}


def readiness():
    """The names of the parts this process can't reach (empty: ready)."""
    return [name for name, check in CHECKS.items() if not check()]


def healthz(request):
    return JsonResponse({"status": "ok"})


def readyz(request):
    unavailable = readiness()
    if unavailable:
        return JsonResponse({"status": "unavailable", "unavailable": unavailable}, status=503)
    return JsonResponse({"status": "ready"})


class ProbeMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.path not in PATHS:
            return self.get_response(request)
        if request.method not in ("GET", "HEAD"):
            return JsonResponse({"status": "method_not_allowed"}, status=405, headers={"Allow": "GET, HEAD"})
        response = healthz(request) if request.path == "/healthz" else readyz(request)
        response["Cache-Control"] = "no-store"
        return response
