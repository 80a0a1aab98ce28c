"""Request bodies checked against the request types the providers publish in their own SDKs.

The `openai` and `anthropic` packages define every endpoint's params as TypedDicts
(`CompletionCreateParamsNonStreaming`, `MessageCreateParamsNonStreaming`, ...), kept by the people
who define the API: a version bump of the SDK brings its new fields here, with no check written by
hand. `RequestSchema` builds pydantic's validator of one such type, once a process, and `problem`
answers the first thing a real server would refuse in a body, worded as OpenAI words a 400
("Invalid type for 'temperature': expected a number, but got a string instead."), or None.

What the validator is told beyond the type (each a rewrite of pydantic's core schema, not of the
types, so the SDK stays the source):
- strict: "n": "2" is a string, as the servers read it, not a number pydantic may coerce;
- lists for the SDK's `Iterable[...]` fields, which pydantic would otherwise validate lazily (never);
- null for every optional field: the servers read a null as the field left out;
- tagged unions where every member names itself by a required literal (`role`, `type`): one
  lookup instead of trying each member (the chat message union has six, a Responses input item
  twenty), and one error naming the field ("Invalid value: 'wizard'. Supported values are: ...").
Fields a type does not name pass as given (vLLM's top_k, chat_template_kwargs, guided_json...), and
nothing is rewritten: the body is only read.

No Django, no app: the gateway's create (batches.endpoints) and the simulated model server
(openrelay.simulator) check with the same schemas.
"""

from __future__ import annotations

import copy
import importlib
import re
import threading
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter, ValidationError
from pydantic_core import SchemaValidator

from openrelay.lib.wording import shown, type_name

# The fields tagged unions are keyed by, in the order they are tried on a union's members.
DISCRIMINATORS = ("type", "role")

_TAG = re.compile(r"'([^']*)'")  # a value in pydantic's list of them: "'a', 'b' or 'c'"
_TYPE_WORDS = {
    "string": "a string",
    "int": "an integer",
    "float": "a number",
    "decimal": "a number",
    "bool": "a boolean",
    "list": "an array",
    "tuple": "an array",
    "set": "an array",
    "dict": "an object",
    "model": "an object",
    "none": "null",
    "bytes": "a string",
}


@dataclass(frozen=True)
class Problem:
    """The first field of a body a server refuses: its path ("messages.0.role") and OpenAI's words."""

    param: str
    message: str
    code: str


class RequestSchema:
    """One endpoint's published request type, `module:Name`, and pydantic's validator of it."""

    def __init__(self, source: str) -> None:
        self.source = source
        self._validator: SchemaValidator | None = None
        self._fields: dict[str, set[str]] = {}  # a typed dict's name (as pydantic's errors say it) -> its fields
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"RequestSchema({self.source!r})"

    @property
    def validator(self) -> SchemaValidator:
        """Built on first use (0.1-8 s: the SDK's import and pydantic's schema), then kept for the process."""
        if self._validator is None:
            with self._lock:
                if self._validator is None:
                    self._fields, self._validator = _build(self.source)
        return self._validator

    def problem(self, body: dict[str, Any], prefix: str = "") -> Problem | None:
        """The first thing the endpoint's server would refuse in `body`, or None. `prefix` goes before
        each param named ("body." in a batch's input line)."""
        try:
            self.validator.validate_python(body, strict=True)
        except ValidationError as exc:
            errors = exc.errors(include_url=False)
            try:
                return _worded(_chosen(errors, body, self._fields), prefix)
            except Exception:  # noqa: BLE001  # a shape the chooser did not foresee: pydantic's first error, never a 500
                first = errors[0]
                param = prefix + ".".join(str(part) for part in first["loc"])
                return Problem(param.rstrip("."), f"Invalid '{param.rstrip('.')}': {first['msg']}.", "invalid_value")
        return None


def _build(source: str) -> tuple[dict[str, set[str]], SchemaValidator]:
    module, name = source.split(":")
    adapter: TypeAdapter[Any] = TypeAdapter(getattr(importlib.import_module(module), name))
    schema = copy.deepcopy(adapter.core_schema)
    definitions = {d["ref"]: d for d in schema.get("definitions", ()) if "ref" in d}
    _rewrite(schema, definitions)
    fields: dict[str, set[str]] = {}
    _collect_fields(schema, fields)
    return fields, SchemaValidator(schema)


def _rewrite(node: Any, definitions: dict[str, Any]) -> None:
    """The rewrites of the module's docstring, in place, over the whole core schema."""
    if isinstance(node, list):
        for item in node:
            _rewrite(item, definitions)
        return
    if not isinstance(node, dict):
        return
    kind = node.get("type")
    if kind == "generator":
        node["type"] = "list"
    elif kind == "typed-dict-field" and not node.get("required", True):
        if node["schema"].get("type") != "nullable":
            node["schema"] = {"type": "nullable", "schema": node["schema"]}
    elif kind == "union":
        _tag(node, definitions)
    for value in list(node.values()):
        _rewrite(value, definitions)


def _collect_fields(node: Any, fields: dict[str, set[str]]) -> None:
    if isinstance(node, list):
        for item in node:
            _collect_fields(item, fields)
    elif isinstance(node, dict):
        if node.get("type") == "typed-dict" and "cls" in node:
            fields.setdefault(node["cls"].__name__, set()).update(node["fields"])
        for value in node.values():
            _collect_fields(value, fields)


def _tag(union: dict[str, Any], definitions: dict[str, Any]) -> None:
    """Turn a union into a tagged union when each member is a typed dict with a required literal
    field of its own values (the same field in each), the values of no two members overlapping."""
    choices = [c[0] if isinstance(c, tuple) else c for c in union["choices"]]
    members = [_resolved(c, definitions) for c in choices]
    if not all(m.get("type") == "typed-dict" for m in members):
        return
    for field in DISCRIMINATORS:
        tags: dict[Any, Any] = {}
        for choice, member in zip(choices, members):
            spec = member["fields"].get(field)
            if spec is None or not spec.get("required", True) or spec["schema"].get("type") != "literal":
                break
            values = spec["schema"]["expected"]
            if any(value in tags or not isinstance(value, str) for value in values):
                break
            tags.update(dict.fromkeys(values, choice))
        else:
            union.clear()
            union.update({"type": "tagged-union", "choices": tags, "discriminator": field})
            return


def _resolved(schema: dict[str, Any], definitions: dict[str, Any]) -> dict[str, Any]:
    while schema.get("type") == "definition-ref":
        schema = definitions.get(schema["schema_ref"], {})
    return schema


# Choosing the error to tell: pydantic reports every member of a plain union that failed (a
# content that is neither a string nor a valid list of parts fails as both). The member that got
# furthest into the body is the one the caller meant; its first error is the one told.


@dataclass
class _Error:
    keys: list[Any]  # the body's path to the value
    steps: list[tuple[int, str]]  # (position in `keys` where it was taken, union member) along the way
    kind: str
    message: str
    context: dict[str, Any]
    value: Any


def _split(error: Any, body: Any) -> _Error:
    """pydantic's `loc` walked over the body: keys and indexes the body has are its path; the rest
    name the union members (and tagged unions' tags) the error was found in."""
    keys: list[Any] = []
    steps: list[tuple[int, str]] = []
    value = body
    loc = error["loc"]
    for index, part in enumerate(loc):
        if isinstance(value, dict) and isinstance(part, str):
            if part in value and not _is_tag(value, part, loc[index + 1 :]):
                keys.append(part)
                value = value[part]
                continue
            if index == len(loc) - 1 and error["type"] == "missing":
                keys.append(part)
                continue
        elif isinstance(value, list) and isinstance(part, int) and 0 <= part < len(value):
            keys.append(part)
            value = value[part]
            continue
        steps.append((len(keys), str(part)))
    return _Error(keys, steps, error["type"], error["msg"], error.get("ctx") or {}, value)


def _is_tag(value: dict[str, Any], part: str, rest: tuple[Any, ...]) -> bool:
    """Is `part`, a key of `value`, the tag a tagged union put in the path ({"type": "function",
    "function": {...}} fails at ("function", "function", "name"))? Only when `value` is tagged so
    and what follows is found in `value` itself, not under `value[part]`."""
    if not any(value.get(field) == part for field in DISCRIMINATORS):
        return False
    if not rest or rest[0] == part:
        return bool(rest)
    inner = value[part]
    return rest[0] in value and not (isinstance(inner, dict) and rest[0] in inner)


def _chosen(errors: list[Any], body: Any, fields: dict[str, set[str]]) -> _Error:
    split = [_split(error, body) for error in errors]
    while True:
        forks = {tuple(error.steps[:1]) for error in split}
        if len(forks) == 1:
            if not split[0].steps:
                return split[0]
            for error in split:
                error.steps = error.steps[1:]
            continue
        split = _member(split, body, fields)


def _member(errors: list[_Error], body: Any, fields: dict[str, set[str]]) -> list[_Error]:
    """Among a union's failed members (the errors grouped by their first step), the errors of the one
    the caller meant: the member that knows most of the object's keys, then the fewest of its own
    keys refused or missing, then the one that got furthest. Errors at the union itself go first."""
    own = [error for error in errors if not error.steps]
    if own:
        return own[:1]
    groups: dict[tuple[int, str], list[_Error]] = {}
    for error in errors:
        groups.setdefault(error.steps[0], []).append(error)
    first = next(iter(groups.values()))[0]
    position = first.steps[0][0]
    value = _at(body, first.keys[:position])
    keys = set(value) if isinstance(value, dict) else set()

    def rank(group: list[_Error]) -> tuple[int, int, int, int]:
        known = len(keys & fields.get(group[0].steps[0][1], set()))
        direct = [error for error in group if len(error.keys) == position + 1]
        refused = sum(error.kind == "literal_error" for error in direct)
        missing = sum(error.kind == "missing" for error in direct)
        return known, -refused, -missing, max(len(error.keys) for error in group)

    ranked = sorted(groups.values(), key=rank, reverse=True)
    best = ranked[0]
    if all(len(error.keys) == position for group in ranked for error in group):
        # Every member failed on the value itself (a number where a string or an array goes): one error.
        expected = [_expected(group[0]) for group in ranked]
        return [_Error(best[0].keys, [], "union_type", "", {"expected": _either(expected)}, best[0].value)]
    literal = next((error for error in best if _refuses(error, position)), None)
    if literal is not None:
        # The object names itself by a literal no member has ({"type": "banana"}): one error, every value.
        refusals = [error for group in ranked for error in group if _refuses(error, position)]
        values = [value for error in refusals if error.keys == literal.keys for value in _values(error)]
        return [_Error(literal.keys, [], "literal_error", "", {"values": values}, literal.value)]
    for error in best:
        error.steps = error.steps[1:]
    return best


def _refuses(error: _Error, position: int) -> bool:
    return error.kind == "literal_error" and len(error.keys) == position + 1


def _values(error: _Error) -> list[str]:
    """The values a literal error allows, from pydantic's "'a', 'b' or 'c'"."""
    return _TAG.findall(str(error.context.get("expected", "")))


def _quoted(values: list[str]) -> str:
    quoted = [f"'{value}'" for value in dict.fromkeys(values)]
    return ", ".join(quoted[:-1]) + f", and {quoted[-1]}" if len(quoted) > 2 else " and ".join(quoted)


def _at(body: Any, keys: list[Any]) -> Any:
    for key in keys:
        body = body[key]
    return body


def _expected(error: _Error) -> str:
    kind = error.kind.removesuffix("_type").removesuffix("_parsing")
    if error.kind == "literal_error":
        return f"one of {error.context.get('expected', '')}"
    if error.kind in ("is_instance_of", "list_type"):
        return "an array"
    return _TYPE_WORDS.get(kind, "a valid value")


def _either(words: list[str]) -> str:
    unique = list(dict.fromkeys(words))
    return unique[0] if len(unique) == 1 else ", ".join(unique[:-1]) + f" or {unique[-1]}"


def _worded(error: _Error, prefix: str) -> Problem:
    param = prefix + ".".join(str(key) for key in error.keys)
    param = param.rstrip(".") or prefix.rstrip(".") or "body"
    kind, context = error.kind, error.context
    if kind == "missing" or kind == "union_tag_not_found":
        field = context.get("discriminator", "").strip("'")
        if field:
            param = f"{param}.{field}"
        return Problem(param, f"Missing required parameter: '{param}'.", "missing_required_parameter")
    if kind == "union_tag_invalid":
        field = context.get("discriminator", "").strip("'")
        param = f"{param}.{field}"
        return Problem(
            param,
            f"Invalid value for '{param}': {shown(context.get('tag'))}. Supported values are: "
            f"{_quoted(_TAG.findall(str(context.get('expected_tags', ''))))}.",
            "invalid_value",
        )
    if kind == "literal_error":
        return Problem(
            param,
            f"Invalid value for '{param}': {shown(error.value)}. Supported values are: "
            f"{_quoted(context.get('values') or _values(error))}.",
            "invalid_value",
        )
    if kind == "union_type":
        expected = context["expected"]
    elif kind.endswith("_type") or kind.endswith("_parsing") or kind == "is_instance_of":
        expected = _expected(error)
    else:
        return Problem(param, f"Invalid value for '{param}': {error.message}.", "invalid_value")
    return Problem(
        param,
        f"Invalid type for '{param}': expected {expected}, but got {type_name(error.value)} instead.",
        "invalid_type",
    )


# The endpoints' published request types: the non-streaming ones (a batch request never streams).
CHAT = RequestSchema("openai.types.chat.completion_create_params:CompletionCreateParamsNonStreaming")
COMPLETIONS = RequestSchema("openai.types.completion_create_params:CompletionCreateParamsNonStreaming")
EMBEDDINGS = RequestSchema("openai.types.embedding_create_params:EmbeddingCreateParams")
MODERATIONS = RequestSchema("openai.types.moderation_create_params:ModerationCreateParams")
RESPONSES = RequestSchema("openai.types.responses.response_create_params:ResponseCreateParamsNonStreaming")
MESSAGES = RequestSchema("anthropic.types.message_create_params:MessageCreateParamsNonStreaming")
