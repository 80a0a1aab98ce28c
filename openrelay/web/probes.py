"""Liveness and readiness probes: GET /healthz and /readyz, for load balancers and Kubernetes.

/healthz says the process answers requests (it touches nothing else, so a
database outage never gets web processes restarted). /readyz says this
process can serve: the database answers a query, the task broker a ping and
(on S3) the bucket a HEAD within OPENRELAY_READYZ_STORAGE_TIMEOUT_S (2 s, one
attempt; its answer reused for OPENRELAY_READYZ_STORAGE_CACHE_S, 5 s, so
probes every second cost the store one request in five); otherwise 503 naming what is not reachable, never why (an error's text can
hold hosts, users or paths), which goes to the log instead.

Answered by a middleware ahead of every other one: a probe carries the
pod's IP as its Host, which ALLOWED_HOSTS may refuse, and it needs no
session, CSRF or host routing.
"""

import logging
import threading
import time

from django.conf import settings
from django.core.files.storage import storages
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


_storage_seen = {"at": None, "ready": True, "client": None}
_storage_lock = threading.Lock()


def storage_ready():
    """The bucket answers a HEAD (cached: see the module's docstring); a local folder is not checked."""
    storage = storages["default"]
    if getattr(storage, "bucket_name", None) is None:  # not S3 (importing boto3 to ask costs ~0.3 s)
        return True
    with _storage_lock:
        at = _storage_seen["at"]
        if at is not None and time.monotonic() - at < settings.OPENRELAY_READYZ_STORAGE_CACHE_S:
            return _storage_seen["ready"]
        ready = _head_bucket(storage)
        _storage_seen.update(at=time.monotonic(), ready=ready)
        return ready


def _head_bucket(storage):
    from botocore.config import Config

    timeout = settings.OPENRELAY_READYZ_STORAGE_TIMEOUT_S
    config = storage.client_config.merge(
        Config(connect_timeout=timeout, read_timeout=timeout, retries={"total_max_attempts": 1})
    )
    try:
        client = _storage_seen["client"]
        if client is None or client[0] is not storage:  # made once: a boto3 client costs ~50 ms to build
            session = storage._create_session()
            made = session.client(
                "s3", region_name=storage.region_name, endpoint_url=storage.endpoint_url, config=config
            )
            client = _storage_seen["client"] = (storage, made)
        client[1].head_bucket(Bucket=storage.bucket_name)
        return True
    except Exception as exc:  # noqa: BLE001 - any error (timeout, refused, 403, 404) means "not ready"
        logger.warning("readiness: file storage is not reachable: %s", type(exc).__name__)
        return False


CHECKS = {"database": database_ready, "broker": broker_ready, "storage": storage_ready}


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
