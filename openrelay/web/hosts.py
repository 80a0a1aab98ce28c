"""Which host serves what: batch and file routes (and the webhooks that report on
batches) live on the inference host, organization routes (billing usage) on the
control-plane host."""

from django.conf import settings

from openrelay.web import dialects

# Webhook endpoints sit with the batches they report on, so one OpenAI client
# pointed at the inference host manages both.
INFERENCE_PREFIXES = (
    "/v1/files",
    "/v1/batches",
    "/v1/models",
    "/v1/limits",
    "/v1/webhook_endpoints",
    "/v1/webhook_event_types",
)
CONTROL_PREFIXES = ("/v1/organization",)


def _host_name(request):
    return request.get_host().rsplit(":", 1)[0].lower()


def _matches(path, prefixes):
    return any(path == p or path.startswith(p + "/") for p in prefixes)


def is_inference_route(path):
    # The dialects' routes too (Anthropic's Message Batches: openrelay.web.dialects).
    return _matches(path, INFERENCE_PREFIXES) or _matches(path, dialects.prefixes())


def is_control_route(path):
    return _matches(path, CONTROL_PREFIXES)


def refused_here(request):
    """True when this host must answer 404 for the route (the other host serves it)."""
    inference_route, control_route = is_inference_route(request.path), is_control_route(request.path)
    if not inference_route and not control_route:
        return False
    inference = [h.lower() for h in settings.OPENRELAY_INFERENCE_HOSTS]
    control = [h.lower() for h in settings.OPENRELAY_CONTROL_HOSTS]
    if not inference and not control:
        return False  # local development: one host serves everything
    host = _host_name(request)
    # A route is served on its own host list when that list is set, and
    # everywhere but the other host list when only that one is.
    own, other = (inference, control) if inference_route else (control, inference)
    if own:
        return host not in own
    return host in other
