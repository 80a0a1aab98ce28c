"""Which host serves what: batch and file routes live on the inference host."""

from django.conf import settings

INFERENCE_PREFIXES = ("/v1/files", "/v1/batches")


def _host_name(request):
    return request.get_host().rsplit(":", 1)[0].lower()


def is_inference_route(path):
    return any(path == p or path.startswith(p + "/") for p in INFERENCE_PREFIXES)


def refused_here(request):
    """True when this host must answer 404 for the route (control-plane host)."""
    if not is_inference_route(request.path):
        return False
    inference = [h.lower() for h in settings.OPENRELAY_INFERENCE_HOSTS]
    control = [h.lower() for h in settings.OPENRELAY_CONTROL_HOSTS]
    if not inference and not control:
        return False  # local development: one host serves everything
    host = _host_name(request)
    if inference:
        return host not in inference
    return host in control
