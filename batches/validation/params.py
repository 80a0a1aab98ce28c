"""The create request's parameters: the JSON body of `POST /v1/batches`
(endpoint, completion window, the input file or inline requests, metadata,
output expiry, priority) checked into a `CreateParams`, raising an `ApiError`
(400) on the first problem, in OpenAI's wording (`openrelay.api.params`).
"""

from dataclasses import dataclass

from openrelay.api.errors import ApiError
from openrelay.api.params import invalid_choice, invalid_type, missing_parameter, request_object, unknown_parameter

ENDPOINTS = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/moderations",
    # Anthropic Messages requests (also served as Message Batches: batches.message_batches).
    "/v1/messages",
)
COMPLETION_WINDOWS = ("24h",)
PRIORITIES = ("standard", "expedited")
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512
OUTPUT_EXPIRY_RANGE = (3600, 2_592_000)

CREATE_PARAMS = (
    "input_file_id",
    "requests",
    "endpoint",
    "completion_window",
    "metadata",
    "output_expires_after",
    "priority",
)


@dataclass(frozen=True)
class CreateParams:
    endpoint: str
    completion_window: str
    input_file_id: str | None = None
    requests: list | None = None
    metadata: dict | None = None
    output_expires_after_s: int | None = None
    priority: str = "standard"


def parse_create_params(data):
    """Check the JSON body of `POST /v1/batches`; raise ApiError (400) on the first problem."""
    request_object(data, CREATE_PARAMS)
    input_file_id, requests = _parse_input(data)
    return CreateParams(
        endpoint=_parse_choice(data, "endpoint", ENDPOINTS),
        completion_window=_parse_choice(data, "completion_window", COMPLETION_WINDOWS),
        input_file_id=input_file_id,
        requests=requests,
        metadata=parse_metadata(data.get("metadata")),
        output_expires_after_s=_parse_output_expiry(data.get("output_expires_after")),
        priority=_parse_choice(data, "priority", PRIORITIES, default="standard"),
    )


def _parse_choice(data, param, allowed, default=None):
    value = data.get(param)
    if value is None:
        if default is None:
            raise missing_parameter(param)
        return default
    if value not in allowed:
        raise invalid_choice(param, value, allowed)
    return value


def _parse_input(data):
    input_file_id, requests = data.get("input_file_id"), data.get("requests")
    if input_file_id is not None and requests is not None:
        raise ApiError(
            "Provide either 'input_file_id' or inline 'requests', not both.", param="requests", code="invalid_value"
        )
    if input_file_id is None and requests is None:
        raise missing_parameter("input_file_id")
    if input_file_id is not None and not isinstance(input_file_id, str):
        raise invalid_type("input_file_id", "a string", input_file_id)
    if requests is not None and not isinstance(requests, list):
        raise invalid_type("requests", "an array of request objects", requests)
    return input_file_id, requests


def parse_metadata(value):
    """null, or at most 16 string -> string pairs (keys <= 64, values <= 512 characters)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid_type("metadata", "an object", value)
    if len(value) > MAX_METADATA_PAIRS:
        raise ApiError(
            f"Invalid 'metadata': too many properties. Expected an object with at most {MAX_METADATA_PAIRS} "
            f"properties, but got an object with {len(value)} properties instead.",
            param="metadata",
            code="invalid_value",
        )
    for key, item in value.items():
        if "\x00" in key or isinstance(item, str) and "\x00" in item:
            # Stored as JSON in the database, where PostgreSQL refuses NUL.
            raise ApiError(
                "Invalid 'metadata': keys and values must not contain NUL (\\u0000) characters.",
                param="metadata",
                code="invalid_value",
            )
        if len(key) > MAX_METADATA_KEY:
            raise ApiError(
                f"Invalid 'metadata': key '{key[:MAX_METADATA_KEY]}...' is too long. Expected keys of at most "
                f"{MAX_METADATA_KEY} characters, but got {len(key)} characters instead.",
                param="metadata",
                code="invalid_value",
            )
        if not isinstance(item, str):
            raise invalid_type(f"metadata.{key}", "a string", item)
        if len(item) > MAX_METADATA_VALUE:
            raise ApiError(
                f"Invalid 'metadata.{key}': string too long. Expected a string with maximum length "
                f"{MAX_METADATA_VALUE}, but got a string with length {len(item)} instead.",
                param=f"metadata.{key}",
                code="invalid_value",
            )
    return value


def _parse_output_expiry(value):
    """`{anchor: "created_at", seconds: 3600..2592000}` -> the seconds, or None."""
    if value is None:
        return None
    param = "output_expires_after"
    if not isinstance(value, dict):
        raise invalid_type(param, "an object", value)
    for key in value:
        if key not in ("anchor", "seconds"):
            raise unknown_parameter(f"{param}.{key}")
    anchor, seconds = value.get("anchor"), value.get("seconds")
    if anchor is None:
        raise missing_parameter(f"{param}.anchor")
    if anchor != "created_at":
        raise invalid_choice(f"{param}.anchor", anchor, ("created_at",))
    if seconds is None:
        raise missing_parameter(f"{param}.seconds")
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        raise invalid_type(f"{param}.seconds", "an integer", seconds)
    low, high = OUTPUT_EXPIRY_RANGE
    if not low <= seconds <= high:
        raise ApiError(
            f"Invalid '{param}.seconds': expected a value between {low} and {high} seconds, but got {seconds} instead.",
            param=f"{param}.seconds",
            code="invalid_value",
        )
    return seconds
