"""What a user can know before submitting: the models to name and the limits a batch must keep.

Both are built from the catalog and from the very constants and settings
validation and the engine enforce, so what they say is what happens.
"""

from django.conf import settings
from django.db.models import Q, Sum

from batches import guardrails, operator, windows
from batches.validation import extensions, jsonl, params, records
from openrelay.core.models import Deployment, Model


def enabled_models():
    # The models a record may name (validation refuses others with model_not_found).
    return (
        Model.objects.filter(enabled=True)
        .select_related("price")
        .annotate(capacity=Sum("deployments__max_concurrency", filter=Q(deployments__enabled=True), default=0))
        .order_by("name")
    )


def concurrency_now():
    """{model pk: the calls its enabled deployments take at once now (their adaptive limits)}."""
    calls, _ = operator.live_calls()
    now = {}
    for deployment in Deployment.objects.filter(enabled=True, model__enabled=True):
        figures = calls.get(deployment.pk, operator.Calls())
        now[deployment.model_id] = now.get(deployment.model_id, 0) + figures.limit_of(deployment)
    return now


def model_object(model, concurrency=None):
    """OpenAI's Model object (`client.models.list()`), plus what OpenRelay knows of it.
    `concurrency`: concurrency_now()."""
    price = getattr(model, "price", None)
    return {
        "id": model.name,
        "object": "model",
        "created": int(model.created_at.timestamp()),
        "owned_by": "openrelay",
        "openrelay": {
            # Calls in flight at once over every batch on the model (its deployments' max_concurrency).
            "max_concurrency": model.capacity,
            # What the engines hold it to now: each deployment's adaptive limit (batches.engine.calls.flow),
            # which moves between a floor and max_concurrency with the servers' answers.
            "concurrency_limit": (concurrency or {}).get(model.pk, model.capacity),
            # USD per 1M tokens at the sync rate; a batch bills this times its priority's multiplier.
            # cached_input is the effective price: the input price unless an operator set a discount.
            "price_per_mtok": None
            if price is None
            else {
                "input": str(price.input_per_mtok),
                "cached_input": str(price.effective_cached_input_per_mtok),
                "output": str(price.output_per_mtok),
            },
            # The default window's: standard pays its rate, expedited the sync price.
            "priority_multiplier": {
                priority: str(windows.default().multiplier(priority)) for priority in params.PRIORITIES
            },
            # Each offered window and the share of the sync price a standard batch pays on it.
            "completion_windows": [window.as_object() for window in windows.offered()],
        },
    }


def limits_object(organization):
    def bounded(limits):
        return {name: {"default": default, "max": cap} for name, (default, cap) in limits.items()}

    return {
        "object": "openrelay.limits",
        "batch": {
            "max_requests": jsonl.MAX_RECORDS,
            "max_file_bytes": settings.OPENRELAY_MAX_UPLOAD_BYTES,
            "max_line_bytes": jsonl.MAX_LINE_BYTES,
            "max_json_body_bytes": settings.DATA_UPLOAD_MAX_MEMORY_SIZE,
            "endpoints": list(params.ENDPOINTS),
            "completion_windows": windows.names(),
            # Each with its seconds and its rate (the share of the sync price a standard batch pays).
            "windows": [window.as_object() for window in windows.offered()],
            "priorities": list(params.PRIORITIES),
            "window_seconds": windows.default().seconds,  # the default window's (24h when offered)
            "call_time_limit_seconds": settings.OPENRELAY_CALL_TIME_LIMIT_S,
            "max_custom_id_length": records.MAX_CUSTOM_ID,
            "max_metadata_pairs": params.MAX_METADATA_PAIRS,
            "create_rate": settings.OPENRELAY_BATCH_CREATE_RATE,
        },
        "tool_config": bounded(extensions.TOOL_CONFIG_LIMITS),
        "workflow": bounded(extensions.WORKFLOW_LIMITS) if organization.workflows_enabled else None,
        "organization": {
            "workflows_enabled": organization.workflows_enabled,
            "max_concurrency": organization.max_concurrency or None,
            "budget": guardrails.budget_object(organization),
        },
    }
