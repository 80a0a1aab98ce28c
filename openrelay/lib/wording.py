"""How a user's JSON value is named in an error message, in OpenAI's words: one home for the API's
parameter checks (openrelay.api.params) and the request-schema checks (openrelay.lib.request_schemas)."""

from typing import Any


def type_name(value: Any) -> str:
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


def shown(value: Any, limit: int = 100) -> str:
    """A user value for a message: repr of a scalar, cut short; the type of anything else.

    Never repr() a parsed container: one nested 1,000 levels deep would
    exhaust Python's recursion limit (a 500 instead of a 400).
    """
    if isinstance(value, (list, dict)):
        return type_name(value)
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
