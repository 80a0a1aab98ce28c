"""The OpenAPI schema of the public API (drf-spectacular), served at /v1/openapi.json.

The views are plain APIViews that build their JSON by hand (presenters), so
drf-spectacular cannot guess their shapes; this module states them once as
named components and the views point at them with `extend_schema`.
tests/reliability_tests/test_schema.py checks the schema covers every /v1/
route and runs schemathesis against it.
"""

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse

from openrelay.api.errors import anthropic_error_type, error_type
from openrelay.api.timestamps import BATCH_TIMESTAMPS


def ref(name):
    return {"$ref": f"#/components/schemas/{name}"}


_NULLABLE_STRING = {"type": "string", "nullable": True}
_FITS = {
    "nullable": True,
    "oneOf": [{"type": "boolean"}, {"type": "string", "enum": ["at_risk"]}],
    "description": 'true, false, "at_risk" (the high figure misses the window), or null (no time).',
}
# A spend cap in USD as batches.validation.params.parse_max_cost takes it: a number, or a decimal string.
_MAX_COST = {
    "oneOf": [
        {"type": "number", "minimum": 0.000000001, "maximum": 1000000000},
        {"type": "string", "pattern": "^[1-9][0-9]{0,8}(\\.[0-9]{1,9})?$"},
    ],
    "nullable": True,
}
_NULLABLE_INT = {"type": "integer", "nullable": True}


def _list_of(item):
    """OpenAI's list envelope (openrelay.api.lists.list_object) around `item` components."""
    return {
        "type": "object",
        "required": ["object", "data", "has_more"],
        "properties": {
            "object": {"type": "string", "enum": ["list"]},
            "data": {"type": "array", "items": ref(item)},
            "first_id": _NULLABLE_STRING,
            "last_id": _NULLABLE_STRING,
            "has_more": {"type": "boolean"},
        },
    }


COMPONENTS = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type", "param", "code"],
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "param": _NULLABLE_STRING,
                    "code": _NULLABLE_STRING,
                },
            }
        },
    },
    "File": {
        "type": "object",
        "required": ["id", "object", "bytes", "created_at", "filename", "purpose"],
        "properties": {
            "id": {"type": "string"},
            "object": {"type": "string", "enum": ["file"]},
            "bytes": {"type": "integer"},
            "created_at": {"type": "integer"},
            "expires_at": _NULLABLE_INT,
            "filename": {"type": "string"},
            "purpose": {"type": "string", "enum": ["batch", "batch_output"]},
            "status": {"type": "string"},
            "status_details": _NULLABLE_STRING,
        },
    },
    "FileList": _list_of("File"),
    "FileDeleted": {
        "type": "object",
        "required": ["id", "object", "deleted"],
        "properties": {
            "id": {"type": "string"},
            "object": {"type": "string", "enum": ["file"]},
            "deleted": {"type": "boolean"},
        },
    },
    "FileUpload": {
        "type": "object",
        "required": ["file", "purpose"],
        "properties": {
            "file": {"type": "string", "format": "binary", "description": "JSONL, one request object per line."},
            "purpose": {"type": "string", "enum": ["batch"]},
            "expires_after[anchor]": {"type": "string", "enum": ["created_at"]},
            "expires_after[seconds]": {"type": "integer", "minimum": 3600, "maximum": 2592000},
        },
    },
    "BatchRequestCounts": {
        "type": "object",
        "required": ["total", "completed", "failed"],
        "properties": {"total": {"type": "integer"}, "completed": {"type": "integer"}, "failed": {"type": "integer"}},
    },
    "BatchUsage": {
        "type": "object",
        "nullable": True,
        "description": (
            "OpenAI's batch usage, its five fields only (clients parse it with OpenAI's model); null until any "
            "token was counted. What the tokens cost is `openrelay.cost`."
        ),
        "required": ["input_tokens", "input_tokens_details", "output_tokens", "output_tokens_details", "total_tokens"],
        "additionalProperties": False,
        "properties": {
            "input_tokens": {"type": "integer"},
            "input_tokens_details": {"type": "object", "properties": {"cached_tokens": {"type": "integer"}}},
            "output_tokens": {"type": "integer"},
            "output_tokens_details": {"type": "object", "properties": {"reasoning_tokens": {"type": "integer"}}},
            "total_tokens": {"type": "integer"},
        },
    },
    "BatchCost": {
        "type": "object",
        "nullable": True,
        "description": (
            "What the batch's billed tokens cost so far, in decimal strings of USD at the prices snapshotted at "
            "create; null until any token was counted. It ends equal to the batch's ledger entry."
        ),
        "required": ["currency", "input", "cached_input", "output", "total"],
        "properties": {
            "currency": {"type": "string"},
            "input": {"type": "string"},
            "cached_input": {"type": "string"},
            "output": {"type": "string"},
            "total": {"type": "string"},
        },
    },
    "BatchUnbilledUsage": {
        "type": "object",
        "nullable": True,
        "description": (
            "Tokens of answers the batch's records got but are not billed for (a tool-calling record that failed "
            "mid-loop), or null while there are none. Never charged; `cost` is what they come to at the batch's "
            "prices, and it counts against the batch's max_cost and the organization's monthly budget."
        ),
        "properties": {
            "input_tokens": {"type": "integer"},
            "input_tokens_details": {"type": "object", "properties": {"cached_tokens": {"type": "integer"}}},
            "output_tokens": {"type": "integer"},
            "total_tokens": {"type": "integer"},
            "cost": {"type": "object"},
        },
    },
    "BatchError": {
        "type": "object",
        "properties": {
            "code": _NULLABLE_STRING,
            "message": _NULLABLE_STRING,
            "param": _NULLABLE_STRING,
            "line": _NULLABLE_INT,
        },
    },
    "Batch": {
        "type": "object",
        "required": [
            "id",
            "object",
            "endpoint",
            "input_file_id",
            "completion_window",
            "status",
            "created_at",
            "request_counts",
        ],
        "properties": {
            "id": {"type": "string"},
            "object": {"type": "string", "enum": ["batch"]},
            "endpoint": {"type": "string"},
            "model": _NULLABLE_STRING,
            "errors": {
                "type": "object",
                "nullable": True,
                "properties": {"object": {"type": "string"}, "data": {"type": "array", "items": ref("BatchError")}},
            },
            "input_file_id": {"type": "string"},
            "completion_window": {"type": "string"},
            "status": {
                "type": "string",
                "enum": [
                    "validating",
                    "failed",
                    "in_progress",
                    "finalizing",
                    "completed",
                    "expired",
                    "cancelling",
                    "cancelled",
                ],
            },
            "output_file_id": _NULLABLE_STRING,
            "error_file_id": _NULLABLE_STRING,
            **{name: _NULLABLE_INT for name in BATCH_TIMESTAMPS},
            "request_counts": ref("BatchRequestCounts"),
            "metadata": {"type": "object", "nullable": True, "additionalProperties": {"type": "string"}},
            "usage": ref("BatchUsage"),
            "priority": {"type": "string", "enum": ["standard", "expedited"]},
            "openrelay": {
                "type": "object",
                "required": ["implausible_usage", "output_contracts"],
                "properties": {
                    "implausible_usage": {
                        "type": "integer",
                        "minimum": 0,
                        "description": (
                            "Records whose server-reported usage cannot be right (no usage on a 200, fewer output "
                            "tokens than answers, more cached than input tokens): kept and billed as reported."
                        ),
                    },
                    "unbilled_usage": ref("BatchUnbilledUsage"),
                    "cost": ref("BatchCost"),
                    "paused": ref("BatchPause"),
                    "max_cost": {**_NULLABLE_STRING, "description": "The batch's spend cap in USD, or null."},
                    "breaker": ref("BatchBreaker"),
                    "output_contracts": {
                        "type": "object",
                        "description": (
                            "Output contracts: records re-asked, re-asks made, and records still invalid after "
                            "their last re-ask (error code invalid_output)."
                        ),
                        "required": ["reasked", "reasks", "invalid_output"],
                        "properties": {
                            name: {"type": "integer", "minimum": 0} for name in ("reasked", "reasks", "invalid_output")
                        },
                    },
                    "admission": {
                        "type": "object",
                        "nullable": True,
                        "description": "The quote's verdict at create: whether it fits its window given what was "
                        "queued on its model, and a warning when it does not (docs/concepts/windows.md).",
                        "properties": {
                            "fits_window": _FITS,
                            "expected_duration_s": {"type": "number", "nullable": True},
                            "expected_completion_at": _NULLABLE_INT,
                            "basis": {"type": "string"},
                            "queued_records": {"type": "integer"},
                            "warning": _NULLABLE_STRING,
                        },
                    },
                    "reuse": {
                        "type": "object",
                        "description": (
                            "Reuse (openrelay.reuse): the mode; the batch's twins (records whose identical request "
                            "another of its records runs); lines answered with a reused answer so far, of which "
                            "from the organization's answer cache; the tokens those answers did not cost."
                        ),
                        "required": [
                            "mode",
                            "twins",
                            "reused",
                            "cache_hits",
                            "saved_input_tokens",
                            "saved_output_tokens",
                        ],
                        "properties": {
                            "mode": {"type": "string", "enum": ["auto", "identical", "cache", "off"]},
                            **{
                                name: {"type": "integer", "minimum": 0}
                                for name in (
                                    "twins",
                                    "reused",
                                    "cache_hits",
                                    "saved_input_tokens",
                                    "saved_output_tokens",
                                )
                            },
                        },
                    },
                    "expected_completion_at": {
                        **_NULLABLE_INT,
                        "description": (
                            "While the batch runs: when it is expected to finish (unix seconds), at the pace of "
                            "its last minute. Null before it runs, when it is stalled, and once it is finished."
                        ),
                    },
                    "time_to_first_result": {
                        "type": "number",
                        "nullable": True,
                        "description": (
                            "Seconds from created_at until its first record ended, succeeded or failed (records "
                            "an expiry or a cancel closed unrun are not results). Null until then."
                        ),
                    },
                    "time_to_complete": {
                        "type": "number",
                        "nullable": True,
                        "description": "Seconds from created_at to completed_at. Null unless the batch completed.",
                    },
                },
            },
        },
    },
    "BatchPause": {
        "type": "object",
        "nullable": True,
        "description": "Why and since when the batch is paused (null: it is not). Its status stays in_progress "
        "and its window clock runs on.",
        "required": ["reason", "since"],
        "properties": {
            "reason": {"type": "string", "enum": ["requested", "spend_cap", "organization_budget", "error_breaker"]},
            "since": {"type": "integer"},
            "message": {"type": "string"},
            "code": _NULLABLE_STRING,
            "line": _NULLABLE_INT,
            "custom_id": _NULLABLE_STRING,
            "failures": _NULLABLE_INT,
        },
    },
    "BatchBreaker": {
        "type": "object",
        "additionalProperties": False,
        "description": "The error breaker's rules (0: off).",
        "properties": {
            "window": {"type": "integer", "minimum": 0, "maximum": 50000},
            "failures": {"type": "integer", "minimum": 0, "maximum": 50000},
            "consecutive": {"type": "integer", "minimum": 0, "maximum": 50000},
        },
    },
    "BatchCreateOptions": {
        "type": "object",
        "additionalProperties": False,
        "description": (
            "OpenRelay's own create options: a spend cap, the error breaker's rules, an output contract, reuse."
        ),
        "properties": {
            "reuse": {
                "type": "string",
                "enum": ["auto", "identical", "cache", "off"],
                "description": (
                    "Which identical records run once: auto (the default: deterministic requests only), identical "
                    "(every identical body), cache (as auto, and answers from the organization's earlier batches), "
                    "off (docs/guides/reuse.md)."
                ),
            },
            "max_cost": {
                **_MAX_COST,
                "description": "Most the batch may cost, in USD; it pauses before its next call could pass it.",
            },
            "breaker": {
                "oneOf": [{"type": "boolean", "enum": [False]}, ref("BatchBreaker")],
                "nullable": True,
                "description": "false turns the breaker off; an object sets its rules (missing ones keep defaults).",
            },
            "output_contract": {
                "description": (
                    "The batch's output contract: {schema: a JSON Schema, max_reasks: 0-5}, or false to "
                    "turn off the contracts response_format would give (docs/guides/output-contracts.md)."
                ),
                "oneOf": [
                    {
                        "type": "object",
                        "properties": {
                            "schema": {"type": "object"},
                            "max_reasks": {"type": "integer", "minimum": 0},
                        },
                        "additionalProperties": False,
                    },
                    {"type": "boolean", "enum": [False]},
                ],
            },
            "admission": {
                "type": "string",
                "enum": ["warn", "strict"],
                "description": (
                    "When the quote says the batch cannot finish in its window given what is queued on its "
                    "model: warn (default) creates it with a warning and batch.at_risk; strict refuses it "
                    "(400 window_cannot_be_met). docs/concepts/windows.md."
                ),
            },
        },
    },
    "BatchResume": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "max_cost": {
                **_MAX_COST,
                "description": "A new spend cap in USD (e.g. to resume a batch its cap paused).",
            }
        },
    },
    "BatchList": _list_of("Batch"),
    "BatchCreate": {
        "type": "object",
        "required": ["endpoint", "completion_window"],
        "description": "Give either input_file_id (an uploaded purpose=batch file) or inline requests.",
        "oneOf": [{"required": ["input_file_id"]}, {"required": ["requests"]}],
        "properties": {
            "input_file_id": {"type": "string"},
            "requests": {
                "type": "array",
                "minItems": 1,
                "maxItems": 50000,
                "items": {"type": "object", "description": "One JSONL request object: custom_id, method, url, body."},
            },
            # Their enums are the endpoint registry's and the offered windows (batches.views.endpoint_enum,
            # a hook after this module's).
            "endpoint": {"type": "string"},
            "completion_window": {"type": "string", "enum": ["24h"]},
            "metadata": {
                "type": "object",
                "nullable": True,
                "maxProperties": 16,
                "additionalProperties": {"type": "string", "maxLength": 512},
            },
            "output_expires_after": {
                "type": "object",
                "required": ["anchor", "seconds"],
                "properties": {
                    "anchor": {"type": "string", "enum": ["created_at"]},
                    "seconds": {"type": "integer", "minimum": 3600, "maximum": 2592000},
                },
            },
            "priority": {"type": "string", "enum": ["standard", "expedited"]},
            "openrelay": ref("BatchCreateOptions"),
        },
    },
}


_EVENT_TYPE = {
    "type": "string",
    "enum": [
        "batch.completed",
        "batch.failed",
        "batch.expired",
        "batch.cancelled",
        "batch.paused",
        "batch.resumed",
        "batch.at_risk",
    ],
}
_ENDPOINT_PROPERTIES = {
    "id": {"type": "string"},
    "object": {"type": "string", "enum": ["webhook_endpoint"]},
    "name": {"type": "string"},
    "url": {"type": "string"},
    "event_types": {"type": "array", "items": {"type": "string"}},
    "signing_secret_hint": {"type": "string"},
    "created_at": {"type": "integer"},
    "updated_at": {"type": "integer"},
}
_ENDPOINT_REQUIRED = ["id", "object", "name", "url", "event_types", "created_at"]
_WEBHOOK_URL = {
    "type": "string",
    "pattern": "^https?://[^/?#\\s]+",
    "maxLength": 2048,
    "description": "An http(s) URL whose host resolves; private addresses are refused "
    "unless OPENRELAY_ALLOW_PRIVATE_URLS is set.",
}

COMPONENTS.update(
    {
        "WebhookEndpoint": {"type": "object", "required": _ENDPOINT_REQUIRED, "properties": _ENDPOINT_PROPERTIES},
        "WebhookEndpointWithSecret": {
            "type": "object",
            "required": [*_ENDPOINT_REQUIRED, "signing_secret"],
            "properties": {**_ENDPOINT_PROPERTIES, "signing_secret": {"type": "string"}},
        },
        "WebhookEndpointList": _list_of("WebhookEndpoint"),
        "WebhookEndpointCreate": {
            "type": "object",
            "required": ["name", "url", "event_types"],
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 200},
                "url": _WEBHOOK_URL,
                "event_types": {"type": "array", "minItems": 1, "items": _EVENT_TYPE},
            },
            "additionalProperties": False,
        },
        "WebhookEndpointUpdate": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 200},
                "url": _WEBHOOK_URL,
                "event_types": {"type": "array", "minItems": 1, "items": _EVENT_TYPE},
            },
            "additionalProperties": False,
        },
        "WebhookEndpointRotate": {
            "type": "object",
            "properties": {"keep_old_secret_active_for_24_hours": {"type": "boolean"}},
            "additionalProperties": False,
        },
        "WebhookEndpointTest": {
            "type": "object",
            "required": ["event_type"],
            "properties": {"event_type": _EVENT_TYPE},
            "additionalProperties": False,
        },
        "WebhookEndpointTestResult": {
            "type": "object",
            "required": ["object", "webhook_endpoint_id", "event_type", "status_code", "success"],
            "properties": {
                "object": {"type": "string", "enum": ["webhook_endpoint.test"]},
                "webhook_endpoint_id": {"type": "string"},
                "event_type": {"type": "string"},
                "status_code": {"type": "integer"},
                "success": {"type": "boolean"},
            },
        },
        "WebhookEndpointDeleted": {
            "type": "object",
            "required": ["id", "object", "deleted"],
            "properties": {
                "id": {"type": "string"},
                "object": {"type": "string", "enum": ["webhook_endpoint.deleted"]},
                "deleted": {"type": "boolean"},
            },
        },
        "WebhookEventTypeList": {
            "type": "object",
            "required": ["object", "data"],
            "properties": {
                "object": {"type": "string", "enum": ["list"]},
                "data": {"type": "array", "items": {"type": "string"}},
            },
        },
    }
)


_TOKEN_RANGE = {
    "type": "object",
    "nullable": True,
    "properties": {
        "low": {"type": "integer"},
        "expected": {"type": "integer"},
        "high": {"type": "integer"},
        "ceiling": {**_NULLABLE_INT, "description": "The sum of the records' output caps; null if one has none."},
        "basis": {"type": "string", "enum": ["history", "max_tokens", "default", "none"]},
        "history_records": {"type": "integer"},
    },
}
COMPONENTS["BatchEstimate"] = {
    "type": "object",
    "description": "A quote for a batch (POST /v1/batches/estimate): nothing is created. docs/guides/estimates.md.",
    "required": ["object", "endpoint", "request_counts", "fits_window", "confidence", "notes"],
    "properties": {
        "object": {"type": "string", "enum": ["openrelay.batch_estimate"]},
        "endpoint": {"type": "string"},
        "model": _NULLABLE_STRING,
        "completion_window": {"type": "string"},
        "priority": {"type": "string", "enum": ["standard", "expedited"]},
        "request_counts": {
            "type": "object",
            "properties": {
                "total": {"type": "integer"},
                "rejected": {"type": "integer"},
                "calls": {
                    "type": "integer",
                    "description": "Records that would call the model: the total less the twins reuse answers.",
                },
            },
        },
        "errors": {
            "type": "object",
            "nullable": True,
            "properties": {"object": {"type": "string"}, "data": {"type": "array", "items": ref("BatchError")}},
        },
        "input_tokens": {
            "type": "object",
            "nullable": True,
            "properties": {
                "total": {"type": "integer"},
                "method": {"type": "string", "enum": ["llamacpp_input_tokens", "vllm_tokenize", "approximation"]},
                "records": {"type": "integer"},
                "counted_records": {"type": "integer"},
                "sampled": {"type": "boolean"},
                "error_pct": {"type": "number", "description": "The total's 95% error, in %."},
                "note": _NULLABLE_STRING,
            },
        },
        "output_tokens": _TOKEN_RANGE,
        "tool_rounds": {
            "type": "object",
            "nullable": True,
            "properties": {
                "records": {"type": "integer"},
                "expected": {"type": "number"},
                "basis": {"type": "string", "enum": ["history", "default"]},
                "history_records": {"type": "integer"},
            },
        },
        "cost": {
            "type": "object",
            "nullable": True,
            "properties": {
                "currency": {"type": "string"},
                "low": {"type": "string"},
                "expected": {"type": "string"},
                "high": {"type": "string"},
                "prices": {"type": "object", "additionalProperties": {"type": "string"}},
                "priced": {"type": "boolean"},
            },
        },
        "time": {
            "type": "object",
            "nullable": True,
            "properties": {
                "expected_duration_s": {"type": "number", "nullable": True},
                "low_duration_s": {"type": "number", "nullable": True},
                "high_duration_s": {"type": "number", "nullable": True},
                "expected_completion_at": _NULLABLE_INT,
                "window_ends_at": {"type": "integer"},
                "basis": {"type": "string", "enum": ["running", "recent_batches", "none"]},
                "records_per_second": {"type": "number", "nullable": True},
                "concurrency_limit": {"type": "integer"},
                "queued_ahead": {"type": "object", "additionalProperties": {"type": "integer"}},
            },
        },
        "fits_window": _FITS,
        "windows": {
            "type": "array",
            "description": "Every offered window as this batch would run on it: its rate, cost and fit.",
            "items": {
                "type": "object",
                "properties": {
                    "window": {"type": "string"},
                    "seconds": {"type": "integer"},
                    "rate": {"type": "string"},
                    "multiplier": {"type": "string"},
                    "cost": {"type": "object", "additionalProperties": {"type": "string"}},
                    "fits_window": _FITS,
                    "window_ends_at": {"type": "integer"},
                },
            },
        },
        "confidence": {"type": "string", "enum": ["high", "medium", "low"]},
        "notes": {"type": "array", "items": {"type": "string"}},
    },
}


_BOUNDED = {
    "type": "object",
    "additionalProperties": {
        "type": "object",
        "properties": {"default": {"type": "integer"}, "max": {"type": "integer"}},
    },
}
COMPONENTS.update(
    {
        "Model": {
            "type": "object",
            "required": ["id", "object", "created", "owned_by"],
            "properties": {
                "id": {"type": "string"},
                "object": {"type": "string", "enum": ["model"]},
                "created": {"type": "integer"},
                "owned_by": {"type": "string"},
                "openrelay": {
                    "type": "object",
                    "properties": {
                        "max_concurrency": {"type": "integer"},
                        "concurrency_limit": {"type": "integer"},
                        "price_per_mtok": {
                            "type": "object",
                            "nullable": True,
                            "properties": {
                                "input": {"type": "string"},
                                "cached_input": {"type": "string"},
                                "output": {"type": "string"},
                            },
                        },
                        "priority_multiplier": {"type": "object", "additionalProperties": {"type": "string"}},
                    },
                },
            },
        },
        "ModelList": {
            "type": "object",
            "required": ["object", "data"],
            "properties": {
                "object": {"type": "string", "enum": ["list"]},
                "data": {"type": "array", "items": ref("Model")},
            },
        },
        "Limits": {
            "type": "object",
            "required": ["object", "batch", "tool_config", "workflow", "organization"],
            "properties": {
                "object": {"type": "string", "enum": ["openrelay.limits"]},
                "batch": {"type": "object"},
                "tool_config": _BOUNDED,
                "workflow": {**_BOUNDED, "nullable": True},
                "organization": {
                    "type": "object",
                    "properties": {
                        "workflows_enabled": {"type": "boolean"},
                        "max_concurrency": _NULLABLE_INT,
                        "budget": {
                            "type": "object",
                            "nullable": True,
                            "description": "The monthly budget and this month's spend, in USD (null: no budget).",
                            "properties": {
                                "currency": {"type": "string"},
                                "period": {"type": "string", "enum": ["month"]},
                                "budget": {"type": "string"},
                                "spent": {"type": "string"},
                                "remaining": {"type": "string"},
                                "exhausted": {"type": "boolean"},
                            },
                        },
                    },
                },
            },
        },
    }
)


# Anthropic's Message Batches (batches.message_batches): its objects and its error envelope.
_RFC3339 = {"type": "string", "format": "date-time"}
_NULLABLE_RFC3339 = {**_RFC3339, "nullable": True}
_COUNTS = ("processing", "succeeded", "errored", "canceled", "expired")
COMPONENTS.update(
    {
        "AnthropicError": {
            "type": "object",
            "required": ["type", "error"],
            "properties": {
                "type": {"type": "string", "enum": ["error"]},
                "error": {
                    "type": "object",
                    "required": ["type", "message"],
                    "properties": {
                        "type": {"type": "string"},
                        "message": {"type": "string"},
                        "code": {"type": "string", "description": "OpenRelay's code for the error."},
                        "param": {"type": "string"},
                    },
                },
                "request_id": _NULLABLE_STRING,
            },
        },
        "MessageBatchCreate": {
            "type": "object",
            "required": ["requests"],
            "properties": {
                "requests": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 100000,
                    "items": {
                        "type": "object",
                        "required": ["custom_id", "params"],
                        "properties": {
                            "custom_id": {"type": "string", "minLength": 1, "maxLength": 64},
                            "params": {
                                "type": "object",
                                "description": "A non-streaming Messages request: model, max_tokens (>= 1) and "
                                "messages required; OpenRelay's `openrelay.tool_config` allowed. Checked at create "
                                "in Anthropic's shapes: a 400 names `requests.<i>.params.<field>`.",
                            },
                        },
                    },
                },
                "openrelay": {
                    "type": "object",
                    "description": "OpenRelay's extension, not Anthropic's: `completion_window` (one of the "
                    "offered windows, GET /v1/limits) instead of the fixed 24 h; `admission` as the Batches "
                    "API's openrelay.admission.",
                    "properties": {
                        "completion_window": {"type": "string"},
                        "admission": {"type": "string", "enum": ["warn", "strict"]},
                    },
                },
            },
        },
        "MessageBatch": {
            "type": "object",
            "required": [
                "id",
                "type",
                "processing_status",
                "request_counts",
                "ended_at",
                "created_at",
                "expires_at",
                "archived_at",
                "cancel_initiated_at",
                "results_url",
            ],
            "properties": {
                "id": {"type": "string", "description": "msgbatch_<x>: the batch batch_<x> of the OpenAI dialect."},
                "type": {"type": "string", "enum": ["message_batch"]},
                "processing_status": {"type": "string", "enum": ["in_progress", "canceling", "ended"]},
                "request_counts": {
                    "type": "object",
                    "required": list(_COUNTS),
                    "properties": {name: {"type": "integer"} for name in _COUNTS},
                },
                "ended_at": _NULLABLE_RFC3339,
                "created_at": _RFC3339,
                "expires_at": _RFC3339,
                "archived_at": _NULLABLE_RFC3339,
                "cancel_initiated_at": _NULLABLE_RFC3339,
                "results_url": {**_NULLABLE_STRING, "description": "Relative to the server, once ended."},
            },
        },
        "MessageBatchList": {
            "type": "object",
            "required": ["data", "has_more", "first_id", "last_id"],
            "properties": {
                "data": {"type": "array", "items": ref("MessageBatch")},
                "has_more": {"type": "boolean"},
                "first_id": _NULLABLE_STRING,
                "last_id": _NULLABLE_STRING,
            },
        },
        "DeletedMessageBatch": {
            "type": "object",
            "required": ["id", "type"],
            "properties": {
                "id": {"type": "string"},
                "type": {"type": "string", "enum": ["message_batch_deleted"]},
            },
        },
    }
)


def anthropic_errors(*statuses):
    """Error responses in Anthropic's envelope (the Messages dialect's routes), one per status."""
    return {
        status: OpenApiResponse(
            response=ref("AnthropicError"), description=f"Anthropic error envelope ({anthropic_error_type(status)})"
        )
        for status in statuses
    }


def errors(*statuses):
    """Error responses in the envelope, one per status."""
    return {
        status: OpenApiResponse(response=ref("Error"), description=f"Error envelope ({error_type(status)})")
        for status in statuses
    }


# Every authenticated route may answer these.
COMMON_ERRORS = (401,)

IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key",
    str,
    OpenApiParameter.HEADER,
    description="Up to 255 characters. A repeat with the same key and request within 24 hours answers the "
    "first object again; the same key with another request is 409 idempotency_key_reused.",
)

LIST_LIMIT = OpenApiParameter(
    "limit",
    {"type": "integer", "minimum": 1, "maximum": 100},
    OpenApiParameter.QUERY,
    description="Page size (default 20).",
)
FILE_LIMIT = OpenApiParameter(
    "limit",
    {"type": "integer", "minimum": 1, "maximum": 10000},
    OpenApiParameter.QUERY,
    description="Page size (default 10,000).",
)
AFTER = OpenApiParameter("after", str, OpenApiParameter.QUERY, description="Cursor: the last id of the previous page.")
ORDER = OpenApiParameter("order", str, OpenApiParameter.QUERY, enum=["asc", "desc"])
PURPOSE = OpenApiParameter("purpose", str, OpenApiParameter.QUERY, description="Only files with this purpose.")
BATCH_ID = OpenApiParameter("batch_id", str, OpenApiParameter.PATH)
FILE_ID = OpenApiParameter("file_id", str, OpenApiParameter.PATH)
MODEL_ID = OpenApiParameter(
    "model_id", str, OpenApiParameter.PATH, description="A model's name, e.g. openrelay/gemma-4-31b."
)
RESULT_KIND = OpenApiParameter(
    "kind",
    str,
    OpenApiParameter.QUERY,
    enum=["output", "error"],
    description="Which lines: the output file's (default) or the error file's.",
)
RESULT_CODE = OpenApiParameter(
    "code",
    str,
    OpenApiParameter.QUERY,
    description="With kind=error, only the lines that failed with this code: the "
    "error's code, or http_<status> for a model's non-2xx answer.",
)
WEBHOOK_ENDPOINT_ID = OpenApiParameter("webhook_endpoint_id", str, OpenApiParameter.PATH)


class AnthropicKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    """Anthropic's routes take the key as x-api-key or as a Bearer token: either one, not both."""

    target_class = "openrelay.core.auth.AnthropicKeyAuthentication"
    name = ["AnthropicApiKeyAuth", "AnthropicBearerAuth"]

    def get_security_requirement(self, auto_schema):
        return [{name: []} for name in self.name]  # alternatives

    def get_security_definition(self, auto_schema):
        return [
            {
                "type": "apiKey",
                "in": "header",
                "name": "x-api-key",
                "description": "An organization API key (`or_...`), as Anthropic's clients send it.",
            },
            {"type": "http", "scheme": "bearer", "description": "An organization API key: `Bearer or_...`."},
        ]


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "openrelay.core.auth.ApiKeyAuthentication"
    name = "ApiKeyAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "An organization API key: `Bearer or_...`."}


def add_components(result, generator, request, public):
    """drf-spectacular postprocessing hook: the named schemas above, and the schema URL's own entry."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    for name, schema in COMPONENTS.items():
        schemas.setdefault(name, schema)
    _require_bodies_with_required_fields(result)
    return result


def _require_bodies_with_required_fields(result):
    """A request body whose schema has required fields is itself required: without it the server answers
    400 for the missing field, which the schema must not call a valid request."""
    schemas = result["components"]["schemas"]
    for operations in result.get("paths", {}).values():
        for operation in operations.values():
            body = operation.get("requestBody") if isinstance(operation, dict) else None
            for media in (body or {}).get("content", {}).values():
                name = media.get("schema", {}).get("$ref", "").rpartition("/")[2]
                if schemas.get(name, {}).get("required"):
                    body["required"] = True
