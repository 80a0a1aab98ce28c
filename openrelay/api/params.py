"""OpenAI's wording for a request's parameters, shared by every app's checks (400s that name the param).

The apps' request checks (batches.validation, webhooks.params, files.params) build their errors from
these, so a wrong type or a missing parameter reads the same on every route, as OpenAI's do.
"""

from openrelay.api.errors import ApiError


def type_name(value):
    """OpenAI's wording for a JSON value's type: 'a string', 'an array', ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def invalid_type(param, expected, value):
    return ApiError(
        f"Invalid type for '{param}': expected {expected}, but got {type_name(value)} instead.",
        param=param,
        code="invalid_type",
    )


def invalid_choice(param, value, allowed, hint=""):
    return ApiError(
        f"Invalid value for '{param}': {shown(value)}. Supported values are: {_quoted_list(allowed)}."
        + (f" {hint}" if hint else ""),
        param=param,
        code="invalid_value",
    )


def _quoted_list(values):
    quoted = [f"'{v}'" for v in values]
    return ", ".join(quoted[:-1]) + f", and {quoted[-1]}" if len(quoted) > 2 else " and ".join(quoted)


def unknown_parameter(param):
    return ApiError(f"Unrecognized request argument supplied: {param}", param=param, code="unknown_parameter")


def missing_parameter(param):
    return ApiError(f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")


def shown(value, limit=100):
    """A user value for a message: repr of a scalar, cut short; the type of anything else.

    Never repr() a parsed container: one nested 1,000 levels deep would
    exhaust Python's recursion limit (a 500 instead of a 400).
    """
    if isinstance(value, (list, dict)):
        return type_name(value)
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def request_object(data, known):
    """A JSON request body that must be an object of only the `known` keys; returns it."""
    if not isinstance(data, dict):
        raise ApiError(
            f"The request body must be a JSON object, but got {type_name(data)} instead.", code="invalid_type"
        )
    for key in data:
        if key not in known:
            raise unknown_parameter(key)
    return data
