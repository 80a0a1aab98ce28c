"""The Batch object's nine timestamps (unix seconds, null until they happen), in OpenAI's order.

The one list: the presenter fills them (batches.presenters), the OpenAPI schema states them
(openrelay.api.openapi) and the `orl` CLI shows them (openrelay.cli.output). Plain Python, no
Django: the CLI imports it too.
"""

BATCH_TIMESTAMPS = (
    "created_at",
    "in_progress_at",
    "expires_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
)
