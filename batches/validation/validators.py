"""Validators of output-contract schemas: how one is built and what its errors look like.

No Django here: the engine's checker processes (batches.validation.checker) import this module
alone, so one starts in ~0.2 s and ~20 MB.

Remote `$ref`s are never fetched (the retriever refuses every one, so a schema can't make a
worker call a URL: such a schema is rejected at create), and `pattern`s run with a bounded
backtrack limit (a catastrophic pattern fails its check instead of holding a worker).
"""

from functools import lru_cache

import jsonschema_rs
import orjson

MAX_ERRORS = 5  # the validator's first errors told to the model and kept in the line
MAX_ERROR_CHARS = 300


class SchemaInvalid(Exception):
    pass


def _refuse_retrieval(uri):
    raise ValueError("remote $ref is not fetched; put the definition in the schema ($defs)")


# fancy-regex's backtracking bounded: a pattern like ^(a+)+$ gives up instead of running for minutes.
_PATTERNS = jsonschema_rs.FancyRegexOptions(backtrack_limit=100_000)


@lru_cache(maxsize=256)
def compiled(schema_text):
    """The validator of one schema (by its canonical text), built once per process; raises
    SchemaInvalid when it is not a valid JSON Schema."""
    try:
        return jsonschema_rs.validator_for(
            orjson.loads(schema_text), retriever=_refuse_retrieval, pattern_options=_PATTERNS
        )
    except (jsonschema_rs.ValidationError, jsonschema_rs.ReferencingError, ValueError) as exc:
        raise SchemaInvalid(str(exc).split("\n", 1)[0][:300]) from None


def errors_of(validator, value):
    """The first MAX_ERRORS errors of `value`, as "$.path: message": [] when it passes.

    `is_valid` first: it allocates nothing and lets go of the GIL, where `iter_errors` builds every
    error (and, for anyOf/oneOf, every branch's errors) as Python objects before the first is read.
    """
    if validator.is_valid(value):
        return []
    errors = []
    for error in validator.iter_errors(value):
        errors.append(f"{_path(error.instance_path)}: {cut(error.message)}")
        if len(errors) >= MAX_ERRORS:
            break
    return errors


def object_errors(value):
    """A json_object contract's errors."""
    return [] if isinstance(value, dict) else ["the answer is JSON but not an object"]


def _path(parts):
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


def cut(text, limit=MAX_ERROR_CHARS):
    return text if len(text) <= limit else text[: limit - 3] + "..."
