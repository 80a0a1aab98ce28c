"""JSON answers: what the simulated model says when a request asks for JSON.

A chat request whose `response_format` is `json_schema` (or a responses
request whose `text.format` is) is answered with an instance of the schema
(guided decoding, as a real server does it); `json_object` with
`{"answer": "..."}`. `[[answer_json:{...}]]` in the prompt makes the answer
exactly that JSON, whatever the format asks.

`[[invalid_output:KIND]]` makes the first answer of the conversation invalid
(`[[invalid_output:KINDxN]]` the first N; a large N keeps it invalid), so
tests can give wrong-then-right answers to an output contract's re-asks. The
answers already given are the conversation's assistant turns with text. KIND:
- `wrong_type`: the first property's value has the wrong type (json_object: an array)
- `missing_field`: the first required property is left out (json_object: an array)
- `truncated`: the JSON is cut in half, finish_reason "length"
- `not_json`: prose around the JSON
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_INVALID = re.compile(r"\[\[invalid_output:(wrong_type|missing_field|truncated|not_json)(?:x(\d+))?\]\]")
_ANSWER_JSON_OPENING = "[[answer_json:"
_SAMPLES: dict[str, Any] = {"string": "sim", "integer": 1, "number": 1.5, "boolean": True, "null": None}


@dataclass
class JsonAnswer:
    text: str
    truncated: bool = False


def json_format(body: dict[str, Any], responses: bool) -> tuple[bool, Any]:
    """(whether the request asks for JSON, its schema or None)."""
    if responses:
        text = body.get("text")
        fmt = text.get("format") if isinstance(text, dict) else None
        schema = fmt.get("schema") if isinstance(fmt, dict) else None
    else:
        fmt = body.get("response_format")
        spec = fmt.get("json_schema") if isinstance(fmt, dict) else None
        schema = spec.get("schema") if isinstance(spec, dict) else None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "json_schema":
        return True, schema if isinstance(schema, dict) else {}
    return kind == "json_object", None


def plan_json_answer(
    body: dict[str, Any], prompt: str, answers_before: int, fallback: str, responses: bool = False
) -> JsonAnswer | None:
    """The JSON answer this request gets, or None when it asks for none."""
    literal = _literal_json(prompt)
    asks, schema = json_format(body, responses)
    if literal is None and not asks:
        return None
    if literal is not None:
        value = literal
    elif schema is not None:
        value = instance_of(schema)
    else:
        value = {"answer": fallback}
    match = _INVALID.search(prompt) if "[[" in prompt else None
    if match is None or answers_before >= int(match[2] or 1):
        return JsonAnswer(json.dumps(value))
    # json_object asks for any object: its wrong answer is one that is not an object.
    return _spoiled(value, match[1], schema, object_only=literal is None and schema is None)


def _spoiled(value: Any, kind: str, schema: Any, object_only: bool = False) -> JsonAnswer:
    text = json.dumps(value)
    if kind == "truncated":
        return JsonAnswer(text[: max(1, len(text) // 2)], truncated=True)
    if kind == "not_json":
        return JsonAnswer(f"Sure! Here is the JSON you asked for: {text}")
    if object_only or not isinstance(value, dict) or not value:
        return JsonAnswer(json.dumps(["not", "an", "object"]))
    required = schema.get("required") if isinstance(schema, dict) else None
    if kind == "missing_field":
        name = required[0] if isinstance(required, list) and required else next(iter(value))
        return JsonAnswer(json.dumps({k: v for k, v in value.items() if k != name}))
    name = next(iter(value))
    wrong: Any = 12345 if isinstance(value[name], str) else "wrong type"
    return JsonAnswer(json.dumps({**value, name: wrong}))


def instance_of(schema: Any, depth: int = 0) -> Any:
    """A simple value valid under a simple schema (types, properties, items, enum, const)."""
    if not isinstance(schema, dict) or depth > 16:
        return {}
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return instance_of(schema[key][0], depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or kind is None and isinstance(schema.get("properties"), dict):
        properties = schema.get("properties")
        if not isinstance(properties, dict):
            return {}
        return {name: instance_of(sub, depth + 1) for name, sub in properties.items()}
    if kind == "array":
        count = schema.get("minItems")
        count = count if isinstance(count, int) and count > 0 else 1
        return [instance_of(schema.get("items"), depth + 1) for _ in range(count)]
    if kind in ("integer", "number") and isinstance(schema.get("minimum"), int | float):
        return schema["minimum"]
    if kind == "string" and isinstance(schema.get("minLength"), int):
        return "s" * max(3, schema["minLength"])
    return _SAMPLES.get(kind) if isinstance(kind, str) else {}


def answers_in(items: list[Any]) -> int:
    """The answers the model already gave in a conversation: assistant turns with text."""
    return sum(1 for item in items if isinstance(item, dict) and item.get("role") == "assistant" and _has_text(item))


def _has_text(item: dict[str, Any]) -> bool:
    content = item.get("content")
    return isinstance(content, str) or isinstance(content, list) and bool(content)


def _literal_json(text: str) -> Any:
    start = text.find(_ANSWER_JSON_OPENING)
    if start < 0:
        return None
    try:
        value, end = json.JSONDecoder().raw_decode(text, start + len(_ANSWER_JSON_OPENING))
    except ValueError:
        return None
    return value if text.startswith("]]", end) else None
