"""Standard Webhooks signatures, as OpenAI signs its webhooks (and the OpenAI SDK's
`client.webhooks.unwrap` / `verify_signature` check them).

Headers: `webhook-id` (the event id, the same on every attempt, so receivers
can drop duplicates), `webhook-timestamp` (unix seconds of this attempt) and
`webhook-signature`: space-separated `v1,<base64 HMAC-SHA256>` of
"{id}.{timestamp}.{body}", one per live secret. Secrets are `whsec_` plus
base64 of 32 random bytes; the HMAC key is the decoded bytes.
"""

import base64
import hashlib
import hmac
import secrets

SECRET_PREFIX = "whsec_"


def new_secret():
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def hint(secret):
    """What the API shows of a secret after creation: enough to tell two apart."""
    return f"{secret[: len(SECRET_PREFIX) + 4]}...{secret[-4:]}"


def signature(secret, event_id, timestamp, body):
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    digest = hmac.new(key, f"{event_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def headers(secrets_in_use, event_id, timestamp, body):
    return {
        "webhook-id": event_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(signature(s, event_id, timestamp, body) for s in secrets_in_use),
    }
