"""The webhook endpoint object in OpenAI's shape (the OpenAI SDK's WebhookEndpoint)."""

from webhooks import signing


def endpoint_object(endpoint, secret=None):
    """`secret`: the signing secret, given only when it was just made (create, rotate)."""
    data = {
        "id": endpoint.public_id,
        "object": "webhook_endpoint",
        "name": endpoint.name,
        "url": endpoint.url,
        "event_types": list(endpoint.event_types),
        "signing_secret_hint": signing.hint(endpoint.signing_secret),
        "created_at": int(endpoint.created_at.timestamp()),
        "updated_at": int(endpoint.updated_at.timestamp()),
    }
    if secret is not None:
        data["signing_secret"] = secret
    return data
