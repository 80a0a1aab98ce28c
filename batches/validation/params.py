"""The create request's parameters: the JSON body of `POST /v1/batches`
(endpoint, completion window, the input file or inline requests, metadata,
output expiry, priority) checked into a `CreateParams`, raising an `ApiError`
(400) on the first problem, in OpenAI's wording (`openrelay.api.params`).
"""

import dataclasses
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from batches import endpoints, reuse, windows
from batches.guardrails import Breaker
from batches.validation import contracts
from batches.validation.extensions import RecordRejected
from openrelay.api.errors import ApiError
from openrelay.api.params import invalid_choice, invalid_type, missing_parameter, request_object, unknown_parameter

# Anthropic Messages requests among them (also served as Message Batches: batches.message_batches).
ENDPOINTS = endpoints.PATHS
PRIORITIES = ("standard", "expedited")
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512
OUTPUT_EXPIRY_RANGE = (3600, 2_592_000)
MIN_COST_USD = Decimal("0.000000001")  # one nano-dollar: the ledger's unit
MAX_COST_USD = Decimal("1000000000")  # a cap beyond a billion dollars is a typo, and nanos of it fit an int64
BREAKER_RULES = ("window", "failures", "consecutive")
MAX_BREAKER_RULE = 50_000  # the most records a batch holds

CREATE_PARAMS = (
    "input_file_id",
    "requests",
    "endpoint",
    "completion_window",
    "metadata",
    "output_expires_after",
    "priority",
    "openrelay",
)
OPENRELAY_PARAMS = ("max_cost", "breaker", "output_contract", "admission", "reuse")
ADMISSIONS = ("warn", "strict")  # batches.estimate.admission


@dataclass(frozen=True)
class CreateParams:
    endpoint: str
    completion_window: str | None = None  # an offered window's name (batches.windows); None: the default one
    input_file_id: str | None = None
    requests: list | None = None
    metadata: dict | None = None
    output_expires_after_s: int | None = None
    priority: str = "standard"
    max_cost_nanos: int | None = None
    breaker: Breaker | None = None  # its rules, those not given at their defaults; None: the defaults
    output_contract: object = None  # the batch's output contract as given (checked), False, or None
    admission: str = "warn"  # strict: refuse a batch its quote says cannot finish in its window
    reuse: str = reuse.DEFAULT_MODE  # which identical records run once (batches.reuse.MODES)


def parse_create_params(data):
    """Check the JSON body of `POST /v1/batches`; raise ApiError (400) on the first problem."""
    request_object(data, CREATE_PARAMS)
    input_file_id, requests = _parse_input(data)
    endpoint = _parse_choice(data, "endpoint", ENDPOINTS)
    max_cost_nanos, breaker, output_contract, admission, reuse_mode = _parse_openrelay(data.get("openrelay"), endpoint)
    return CreateParams(
        endpoint=endpoint,
        completion_window=_parse_window(data),
        input_file_id=input_file_id,
        requests=requests,
        metadata=parse_metadata(data.get("metadata")),
        output_expires_after_s=_parse_output_expiry(data.get("output_expires_after")),
        priority=_parse_choice(data, "priority", PRIORITIES, default="standard"),
        max_cost_nanos=max_cost_nanos,
        breaker=breaker,
        output_contract=output_contract,
        admission=admission,
        reuse=reuse_mode,
    )


def _parse_openrelay(value, endpoint):
    """OpenRelay's create extension, `{"max_cost": USD, "breaker": false | {window, failures,
    consecutive}, "output_contract": {...} | false, "admission": "warn" | "strict", "reuse": mode}` -> (the
    cap in nano-dollars or None, the breaker's rules or None for the defaults, the batch's output contract
    as given once checked, False, or None, the admission, the reuse mode)."""
    if value is None:
        return None, None, None, "warn", reuse.DEFAULT_MODE
    if not isinstance(value, dict):
        raise invalid_type("openrelay", "an object", value)
    for key in value:
        if key not in OPENRELAY_PARAMS:
            raise unknown_parameter(f"openrelay.{key}")
    return (
        parse_max_cost(value.get("max_cost"), "openrelay.max_cost"),
        _parse_breaker(value.get("breaker")),
        _parse_output_contract(value.get("output_contract"), endpoint),
        _parse_choice(value, "admission", ADMISSIONS, default="warn", param="openrelay.admission"),
        _parse_choice(value, "reuse", reuse.MODES, default=reuse.DEFAULT_MODE, param="openrelay.reuse"),
    )


def parse_max_cost(value, param):
    """A spend cap in USD (a number, or a decimal string for exactness) -> nano-dollars; None stays None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise invalid_type(param, "a number of US dollars", value)
    try:
        amount = Decimal(str(value))
    except InvalidOperation:
        raise invalid_type(param, "a number of US dollars", value) from None
    if not amount.is_finite() or amount < MIN_COST_USD or amount > MAX_COST_USD:
        raise ApiError(
            f"Invalid '{param}': expected an amount of US dollars from {MIN_COST_USD} to {MAX_COST_USD}, "
            f"but got {str(value)[:40]} instead.",
            param=param,
            code="invalid_value",
        )
    return int(amount * 10**9)


def _parse_breaker(value):
    """false: off (every rule 0); an object: its rules, missing ones at their defaults; else None (the defaults)."""
    if value is None or value is True:
        return None
    if value is False:
        return Breaker.off()
    if not isinstance(value, dict):
        raise invalid_type("openrelay.breaker", "false or an object", value)
    rules = {}
    for key in value:
        if key not in BREAKER_RULES:
            raise unknown_parameter(f"openrelay.breaker.{key}")
    for key in BREAKER_RULES:
        rule, param = value.get(key), f"openrelay.breaker.{key}"
        if rule is not None and (isinstance(rule, bool) or not isinstance(rule, int)):
            raise invalid_type(param, "an integer", rule)
        if rule is not None and not 0 <= rule <= MAX_BREAKER_RULE:
            raise ApiError(
                f"Invalid '{param}': expected a value between 0 and {MAX_BREAKER_RULE}, but got {rule} instead.",
                param=param,
                code="invalid_value",
            )
        if rule is not None:
            rules[key] = rule
    # Failures above window: that rule can never trip (as with 0, it is off).
    return dataclasses.replace(Breaker.default(), **rules)


def _parse_output_contract(contract, endpoint):
    """The batch's output contract (docs/guides/output-contracts.md): as given once checked, False, or None."""
    if contract is None:
        return None
    try:
        checked = contracts.normalize_output_contract(contract, "openrelay.output_contract")
    except RecordRejected as exc:
        raise ApiError(exc.message, param=exc.param, code=exc.code) from None
    if checked is not False and endpoint not in contracts.CONTRACT_ENDPOINTS:
        raise ApiError(
            f"Output contracts are supported on {' and '.join(contracts.CONTRACT_ENDPOINTS)} only.",
            param="openrelay.output_contract",
            code=contracts.CODE,
        )
    return contract


def _parse_window(data):
    value = data.get("completion_window")
    if value is None:
        raise missing_parameter("completion_window")
    return windows.parse(value).name


def _parse_choice(data, key, allowed, default=None, param=None):
    value = data.get(key)
    param = param or key
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
