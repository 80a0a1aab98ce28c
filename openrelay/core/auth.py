"""Bearer authentication with `or_` API keys."""

import hmac
import time
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db.models.signals import post_delete, post_save
from django.utils import timezone
from rest_framework import authentication, exceptions

from openrelay.core.models import KEY_PREFIX, LOOKUP_LENGTH, ApiKey, Organization, hash_key

# last_used_at is informative; writing it on every request would make every
# read a write, so it is refreshed at most once a minute.
_LAST_USED_GRANULARITY = timedelta(seconds=60)


@dataclass(frozen=True)
class ApiPrincipal:
    """What a view knows about its caller: the key and its organization."""

    api_key: ApiKey

    @property
    def organization(self):
        return self.api_key.organization

    is_authenticated = True


# A polling client sends the same key on every request: its row (and organization) is read
# once per OPENRELAY_API_KEY_CACHE_S (5 s) in each process instead of on every request, a
# query and about a quarter of a batch GET's time. A save or delete of a key or an
# organization in this process empties the cache; one in another process (a revoke in the
# admin) takes effect there within the cache time.
_known = {}  # sha256 of a key -> (its active ApiKey, monotonic time it was read)
_KNOWN_MAX = 10_000


def authenticate_key(plaintext):
    """Return the active ApiKey for a plaintext key, or None."""
    if not plaintext.startswith(KEY_PREFIX) or len(plaintext) <= LOOKUP_LENGTH:
        return None
    hashed, now = hash_key(plaintext), time.monotonic()
    known = _known.get(hashed)
    if known is not None and now - known[1] < settings.OPENRELAY_API_KEY_CACHE_S:
        key = known[0]
    else:
        key = ApiKey.objects.active().select_related("organization").filter(lookup=plaintext[:LOOKUP_LENGTH]).first()
        if key is None or not hmac.compare_digest(key.hashed, hashed):
            _known.pop(hashed, None)
            return None
        if len(_known) >= _KNOWN_MAX:
            _known.clear()
        _known[hashed] = (key, now)
    _touch(key)
    return key


def _forget_keys(**kwargs):
    _known.clear()


for _model in (ApiKey, Organization):
    post_save.connect(_forget_keys, sender=_model, dispatch_uid=f"forget-keys-{_model.__name__}-save")
    post_delete.connect(_forget_keys, sender=_model, dispatch_uid=f"forget-keys-{_model.__name__}-delete")


def _touch(key):
    now = timezone.now()
    if key.last_used_at is None or now - key.last_used_at > _LAST_USED_GRANULARITY:
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
        key.last_used_at = now


class ApiKeyAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request):
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            raise exceptions.NotAuthenticated(
                "You didn't provide an API key. Send it as 'Authorization: Bearer or_...'."
            )
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise exceptions.AuthenticationFailed("Malformed Authorization header. Use 'Authorization: Bearer or_...'.")
        key = authenticate_key(token.strip())
        if key is None:
            raise exceptions.AuthenticationFailed("Incorrect API key provided.")
        return ApiPrincipal(key), key

    def authenticate_header(self, request):
        return 'Bearer realm="openrelay"'


class AnthropicKeyAuthentication(ApiKeyAuthentication):
    """Anthropic's clients send the key as `x-api-key` (or as a Bearer token with `auth_token`): either works."""

    def authenticate(self, request):
        if "HTTP_X_API_KEY" not in request.META:
            if not request.META.get("HTTP_AUTHORIZATION"):
                raise exceptions.NotAuthenticated(
                    "You didn't provide an API key. Send it as 'x-api-key: or_...' or 'Authorization: Bearer or_...'."
                )
            return super().authenticate(request)
        key = authenticate_key(request.META["HTTP_X_API_KEY"].strip())  # sent but blank: a wrong key, not none
        if key is None:
            raise exceptions.AuthenticationFailed("Incorrect API key provided.")
        return ApiPrincipal(key), key

    def authenticate_header(self, request):
        return 'x-api-key realm="openrelay"'
