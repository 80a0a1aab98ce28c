"""Output contracts (issue 38): what a record's final answer must be, and the checks of it.

A contract comes from, in this order: the record's `openrelay.output_contract`
(a JSON Schema and `max_reasks`), the record's own `response_format`
(chat completions) or `text.format` (responses) of type `json_schema` or
`json_object`, or the batch's `openrelay.output_contract` given at create.
`"output_contract": false` (on the record or the batch) turns contracts off,
even one `response_format` would give.

Schemas are compiled at create (one that is not a valid JSON Schema rejects
the record with `invalid_output_contract`) and once per process for each
distinct schema text at run time (an LRU of validators): a batch of 50,000
records with one schema compiles it once. The validator is jsonschema-rs,
chosen by measurement (docs/guides/output-contracts.md: 3.6 us a passing
answer against jsonschema's 187 us and fastjsonschema's 15 us, which also
reports only the first error and compiles schemas to Python source it execs).

A schema is also refused at create when checking one answer against it would
cost too much (batches.validation.schema_cost): more than MAX_SCHEMA_NODES
subschemas visited at one place of the answer and along one way down from it,
`$ref`s followed where they stand, or references nested more than
MAX_SCHEMA_DEPTH deep. The validators themselves (remote `$ref`s refused,
patterns bounded) are built in batches.validation.validators.
"""

from dataclasses import dataclass
from functools import lru_cache

import orjson

from batches import endpoints
from batches.validation import schema_cost
from batches.validation.extensions import RecordRejected, wrong_type
from batches.validation.validators import SchemaInvalid, compiled

CODE = "invalid_output_contract"
PARAM = "body.openrelay.output_contract"
DEFAULT_MAX_REASKS = 2
MAX_REASKS_CAP = 5
# Endpoints whose answer is text a contract can read and whose conversation a re-ask can extend.
CONTRACT_ENDPOINTS = endpoints.paths_where("contracts")
MAX_SCHEMA_BYTES = 64 * 1024
# The work one check may cost, counted at create (schema_cost). Measured (2026-12-06, jsonschema-rs
# 0.60, the 2-core machine), subschemas visited at one place of the answer and down its costliest way:
# real schemas: the OpenAPI 2.0 schema (26 KB) 2,096, OpenAPI 3.0 1,202, 3.1 169, the draft 2020-12
# meta-schema 4,013 (its $dynamicRef counted to every anchor), draft 7 8; nesting: 38 at most
# (OpenAPI 3.2). The doubling chain d_n = anyOf[$ref d_n-1, $ref d_n-1]: 2^(n+2) - 2, so 4,094 at
# 10 levels, 16,382 at 12 (an invalid answer: 69 ms and 50 MB of errors), 262,142 at 16 (3.6 s,
# 558 MB). 10,000 passes every real schema above with room, and refuses the chain from 12 levels.
MAX_SCHEMA_NODES = 10_000
MAX_SCHEMA_DEPTH = 64


@dataclass(frozen=True)
class Contract:
    """One record's contract: `schema_text` None means "a JSON object" (json_object)."""

    schema_text: bytes | None
    max_reasks: int
    source: str  # "record", "response_format" (or text.format) or "batch"

    @property
    def model_sees_schema(self):
        """Whether the model was given the schema (in the body it answers): a re-ask that it
        wasn't given must quote it."""
        return self.source == "response_format"

    def validator(self):
        return compiled(self.schema_text) if self.schema_text is not None else None

    def cost(self):
        """What one check costs (schema_cost.Cost); None for json_object."""
        return cost_of(self.schema_text) if self.schema_text is not None else None


@lru_cache(maxsize=256)
def cost_of(schema_text):
    """The schema's schema_cost.Cost, counted once per process (0.3-10 ms: the OpenAPI schemas take
    the longest); raises schema_cost.TooCostly past the budget."""
    return schema_cost.cost(orjson.loads(schema_text), MAX_SCHEMA_NODES, MAX_SCHEMA_DEPTH)


def canonical(schema, code, param):
    """The schema's canonical text (sorted keys), the validators' cache key; compiled here, so a schema
    that is not one is refused where it is given."""
    if not isinstance(schema, dict | bool):
        raise wrong_type(code, param, "an object (a JSON Schema)", schema)
    try:
        text = orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)
    except (orjson.JSONEncodeError, TypeError) as exc:
        raise RecordRejected(code, f"Invalid '{param}': {exc}.", param) from None
    if len(text) > MAX_SCHEMA_BYTES:
        raise RecordRejected(
            code, f"Invalid '{param}': the schema is {len(text)} bytes; at most {MAX_SCHEMA_BYTES} are accepted.", param
        )
    try:
        compiled(text)
    except SchemaInvalid as exc:
        raise RecordRejected(code, f"Invalid '{param}': not a valid JSON Schema: {exc}.", param) from None
    try:
        cost_of(text)
    except schema_cost.TooCostly as exc:
        raise RecordRejected(code, f"Invalid '{param}': the schema is too costly to check: {exc}.", param) from None
    return text


def normalize_output_contract(value, param=PARAM):
    """An `output_contract` object checked: False (contracts off), or {"schema": text or None,
    "max_reasks": n}. Raises RecordRejected (`invalid_output_contract`)."""
    if value is False:
        return False
    if not isinstance(value, dict):
        raise wrong_type(CODE, param, "an object or false", value)
    for key in value:
        if key not in ("schema", "max_reasks"):
            raise RecordRejected(CODE, f"Unknown parameter '{param}.{key}'.", f"{param}.{key}")
    schema = value.get("schema")
    text = canonical(schema, CODE, f"{param}.schema") if schema is not None else None
    return {"schema": text, "max_reasks": _max_reasks(value.get("max_reasks"), f"{param}.max_reasks")}


def batch_contract(stored):
    """A batch's stored contract (as given at create, already checked) as the record checks and
    the engine use it: normalized, False, or None."""
    return None if stored is None else normalize_output_contract(stored, "openrelay.output_contract")


def _max_reasks(value, param):
    if value is None:
        return None
    if isinstance(value, bool) or not (isinstance(value, int) or isinstance(value, float) and value.is_integer()):
        raise wrong_type(CODE, param, "an integer", value)
    if value < 0:
        raise RecordRejected(
            CODE, f"Invalid '{param}': expected a non-negative integer, but got {value} instead.", param
        )
    return min(int(value), MAX_REASKS_CAP)


def from_format(body, endpoint):
    """(schema text or None, param) when the body's own response format asks for JSON, else None.

    Chat: `response_format` {type: json_schema, json_schema: {schema}} or {type: json_object}.
    Responses: `text.format` {type: json_schema, schema} or {type: json_object}. Other shapes
    are the model server's to refuse: they make no contract.
    """
    answers = endpoints.get(endpoint).answers
    if answers == "chat":
        fmt, param = body.get("response_format"), "body.response_format"
        if not isinstance(fmt, dict):
            return None
        if fmt.get("type") == "json_schema":
            spec = fmt.get("json_schema")
            schema = spec.get("schema") if isinstance(spec, dict) else None
            return _format_schema(schema, f"{param}.json_schema.schema")
    elif answers == "responses":
        text = body.get("text")
        fmt, param = (text.get("format") if isinstance(text, dict) else None), "body.text.format"
        if not isinstance(fmt, dict):
            return None
        if fmt.get("type") == "json_schema":
            return _format_schema(fmt.get("schema"), f"{param}.schema")
    else:
        return None
    if fmt.get("type") == "json_object":
        return (None,)
    return None


def _format_schema(schema, param):
    # json_schema without a schema: any JSON value passes, but the answer must parse.
    return (canonical(schema if schema is not None else {}, CODE, param),)


def contract_for(body, endpoint, batch_contract=None):
    """The record's Contract, or None. Raises RecordRejected for a contract that can't be one.

    `batch_contract` is the batch's normalized contract (normalize_output_contract), False
    (contracts off) or None.
    """
    extension = body.get("openrelay")
    own = extension.get("output_contract") if isinstance(extension, dict) else None
    if own is not None:
        own = normalize_output_contract(own)
        if own is False:
            return None
    elif batch_contract is False:
        return None
    if endpoint not in CONTRACT_ENDPOINTS:
        if own is not None:
            raise RecordRejected(
                CODE, f"Output contracts are supported on {' and '.join(CONTRACT_ENDPOINTS)} only.", PARAM
            )
        return None
    found = from_format(body, endpoint)
    batch = batch_contract or None
    if own is None and (batch is None or batch["schema"] is None) and found is None:
        return None  # nothing asks this record for JSON (a batch's max_reasks alone only tunes)
    return _merged(own, batch, found)


def _merged(own, batch, found):
    """The record's schema first, then its response format's, then the batch's; its max_reasks
    first, then the batch's, then the default."""
    if own is not None and own["schema"] is not None:
        schema, source = own["schema"], "record"
    elif found is not None:
        schema, source = found[0], "response_format"
    elif batch is not None and batch["schema"] is not None:
        schema, source = batch["schema"], "batch"
    else:
        raise RecordRejected(
            CODE,
            "An output contract needs a 'schema', or the record's own response_format (or text.format) "
            "of type json_schema or json_object.",
            PARAM,
        )
    reasks = next(
        (c["max_reasks"] for c in (own, batch) if c is not None and c["max_reasks"] is not None), DEFAULT_MAX_REASKS
    )
    return Contract(schema, reasks, source)
