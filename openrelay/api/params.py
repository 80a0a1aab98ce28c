"""OpenAI's wording for a request's parameters, shared by every app's checks (400s that name the param).

The apps' request checks (batches.validation, webhooks.params, files.params) build their errors from
these, so a wrong type or a missing parameter reads the same on every route, as OpenAI's do.
"""

from openrelay.api.errors import ApiError
from openrelay.lib.wording import shown, type_name


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
