"""Bearer authentication with `or_` API keys."""

import hmac
from dataclasses import dataclass
from datetime import timedelta

from django.utils import timezone
from rest_framework import authentication, exceptions

from openrelay.core.models import KEY_PREFIX, LOOKUP_LENGTH, ApiKey, hash_key

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


def authenticate_key(plaintext):
    """Return the active ApiKey for a plaintext key, or None."""
    if not plaintext.startswith(KEY_PREFIX) or len(plaintext) <= LOOKUP_LENGTH:
        return None
    key = ApiKey.objects.active().select_related("organization").filter(lookup=plaintext[:LOOKUP_LENGTH]).first()
    if key is None or not hmac.compare_digest(key.hashed, hash_key(plaintext)):
        return None
    _touch(key)
    return key


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
