"""Per-organization rate limits (DRF throttling).

`BatchCreateThrottle` bounds how many batches one organization may create:
`OPENRELAY_BATCH_CREATE_RATE` ("2000/hour" by default; "N/second|minute|
hour|day"). `BatchEstimateThrottle` bounds its quotes (the API's and the
dashboard's, one budget): `OPENRELAY_BATCH_ESTIMATE_RATE` ("10/minute"), as
a quote reads the whole file and asks the model server's tokenizer. Every API
key of an organization shares the one budget, so issuing more keys does not
buy more. Over the limit the request is answered 429 in the error envelope,
code `rate_limit_exceeded`, with a `Retry-After` header (the OpenAI SDK waits
that long and retries, up to its retry count).

Counts live in Django's cache: Redis when REDIS_URL is set, so every web
process shares them; the embedded default (one web process) keeps them in
process memory.
"""

import logging
import math
from types import SimpleNamespace

from django.conf import settings
from django.core.cache import caches
from rest_framework.throttling import SimpleRateThrottle

from openrelay.api.errors import ApiError
from openrelay.lib.env import parse_rate

logger = logging.getLogger("openrelay.api")


class OrganizationRateThrottle(SimpleRateThrottle):
    """A SimpleRateThrottle keyed by the caller's organization, rate read from a setting."""

    setting_name = None
    # What the 429's message says the organization may do, "{rate}" as describe() puts it.
    allowance = ""

    @property
    def cache(self):
        return caches["default"]

    def get_rate(self):
        # Read per request, not at import: tests and operators change the setting.
        return getattr(settings, self.setting_name)

    def parse_rate(self, rate):
        return parse_rate(rate) if rate else (None, None)

    def get_cache_key(self, request, view):
        organization = getattr(request.user, "organization", None)
        if organization is None:
            return None  # unauthenticated requests are refused before throttling matters
        # The creation time is in the key because a recreated database (tests,
        # a reset install) reuses primary keys while the cache outlives it.
        return f"throttle:{self.scope}:{organization.pk}:{organization.created_at.timestamp():.6f}"

    def allow_request(self, request, view):
        # Read the rate now (SimpleRateThrottle reads it once, in __init__).
        self.rate = self.get_rate()
        self.num_requests, self.duration = self.parse_rate(self.rate)
        try:
            return super().allow_request(request, view)
        except Exception:  # the cache (Redis) is down
            # A rate limit is a guard, not a dependency: while its counters
            # can't be read, requests go through rather than fail.
            logger.warning("rate limit %s not checked: the cache is unavailable", self.scope, exc_info=True)
            return True

    def describe(self):
        number, seconds = self.num_requests, self.duration
        period = {1: "second", 60: "minute", 3600: "hour", 86400: "day"}.get(seconds, f"{seconds} seconds")
        return f"{number} per {period}"

    @classmethod
    def exceeded(cls, wait):
        """The 429 for a request over the limit (raise it from the view's `throttled`)."""
        retry_after = max(1, math.ceil(wait or 1))
        return ApiError(
            f"Rate limit reached for {cls.allowance.format(rate=cls().describe())}. "
            f"Try again in {retry_after} seconds.",
            status=429,
            code="rate_limit_exceeded",
            headers={"Retry-After": str(retry_after)},
        )

    def check(self, organization):
        """Count a request of `organization` made outside DRF (the dashboard's forms); the 429 over the limit."""
        # allow_request reads only request.user.organization.
        if not self.allow_request(SimpleNamespace(user=SimpleNamespace(organization=organization)), None):
            raise self.exceeded(self.wait())


class BatchCreateThrottle(OrganizationRateThrottle):
    """`POST /v1/batches`: OPENRELAY_BATCH_CREATE_RATE per organization."""

    scope = "batch_create"
    setting_name = "OPENRELAY_BATCH_CREATE_RATE"
    allowance = "batch creation: this organization may create {rate}"


class BatchEstimateThrottle(OrganizationRateThrottle):
    """`POST /v1/batches/estimate` and the dashboard's quote: OPENRELAY_BATCH_ESTIMATE_RATE per organization."""

    scope = "batch_estimate"
    setting_name = "OPENRELAY_BATCH_ESTIMATE_RATE"
    allowance = "batch quotes: this organization may ask for {rate}"
