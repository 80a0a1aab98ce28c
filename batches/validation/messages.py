"""An Anthropic Messages request's params (a `/v1/messages` body) checked in Anthropic's shapes.

FIELDS is a table of field -> check: the shapes a Messages server refuses (a model not in the
catalog, a max_tokens no model can answer, messages that are not a list of user/assistant turns,
sampling values out of range, `stream`), in Anthropic's words. After the table, the body is checked
against the `anthropic` SDK's own MessageCreateParams (openrelay.lib.request_schemas), which knows
every field it publishes (`thinking`, `output_config`, ...); fields neither names pass as given, as
a native deployment reads them itself. A check raises Invalid with the path under the field; `check`
turns the first one into ParamInvalid("messages.0.role", ...), which each caller words its own way
(a Message Batch's create: batches.message_batches.params).
"""

from dataclasses import dataclass

from openrelay.lib import request_schemas
from openrelay.lib.wording import shown, type_name

ROLES = ("user", "assistant")
TOOL_CHOICES = ("auto", "any", "tool", "none")
# The most answer tokens a request may ask of a model whose catalog entry sets no max_output_tokens.
# 2**20: past any model's output today (Anthropic's largest is 128k); it refuses typos and 10**12.
MAX_TOKENS_CEILING = 1 << 20


class Invalid(Exception):
    """A check's refusal: `at` is the path under its field (2, "content", 0, "type"), empty for the field."""

    def __init__(self, message, *at, code="invalid_value"):
        super().__init__(message)
        self.message, self.at, self.code = message, at, code


class ParamInvalid(Exception):
    """The first problem of a request's params: `field` is its path ("max_tokens", "messages.0.role")."""

    def __init__(self, field, message, code):
        super().__init__(f"{field}: {message}")
        self.field, self.message, self.code = field, message, code


@dataclass(frozen=True)
class Catalog:
    """The models a request may name: {catalog name: its max_output_tokens, or None}."""

    caps: dict

    def cap(self, model):
        return self.caps.get(model) or MAX_TOKENS_CEILING


def check(params, catalog):
    """Raise ParamInvalid for the first field that is missing or has a shape Anthropic refuses."""
    for field in REQUIRED:
        if params.get(field) is None:
            raise ParamInvalid(field, "Field required", "missing_required_parameter")
    for field, rule in FIELDS.items():
        if params.get(field) is not None:  # null is an optional field left out, as Anthropic reads it
            try:
                rule(params[field], params, catalog)
            except Invalid as problem:
                path = ".".join((field, *map(str, problem.at)))
                raise ParamInvalid(path, problem.message, problem.code) from None
    # Then every field the SDK's MessageCreateParams names, as Anthropic's API refuses them (`thinking`,
    # `output_config`, a block's own fields...): the table above keeps the checks it words better or the
    # published type lacks (the catalog's models and caps, sampling ranges, `stream`).
    problem = request_schemas.MESSAGES.problem(params)
    if problem is not None:
        raise ParamInvalid(problem.param, problem.message, problem.code)


def _wrong_type(expected, value, *at):
    return Invalid(f"Input should be {expected}, but got {type_name(value)}.", *at, code="invalid_type")


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _model(value, params, catalog):
    if not isinstance(value, str):
        raise _wrong_type("a string", value)
    if value not in catalog.caps:
        # The OpenAI dialect's words for the same refusal (batches.validation.records).
        raise Invalid(
            f"The provided model {shown(value)} is not supported by the Batch API; GET /v1/models lists the models "
            "you can use.",
            code="model_not_found",
        )


def _max_tokens(value, params, catalog):
    if not _is_int(value):
        raise _wrong_type("an integer", value)
    if value < 1:
        raise Invalid(f"Input should be greater than or equal to 1, but got {value}.")
    cap = catalog.cap(params["model"])
    if value > cap:
        raise Invalid(f"{value} > {cap}, which is the maximum allowed number of output tokens for {params['model']}.")


def _messages(value, params, catalog):
    if not isinstance(value, list):
        raise _wrong_type("a list of messages", value)
    if not value:
        raise Invalid("List should have at least 1 item.")
    for index, message in enumerate(value):
        _message(message, index)


def _message(message, index):
    if not isinstance(message, dict):
        raise _wrong_type("an object with 'role' and 'content'", message, index)
    if message.get("role") not in ROLES:
        raise Invalid(f"Input should be 'user' or 'assistant', but got {shown(message.get('role'))}.", index, "role")
    content = message.get("content")
    if content is None:
        raise Invalid("Field required", index, "content", code="missing_required_parameter")
    if not isinstance(content, str):
        _blocks(content, index, "content")


def _blocks(value, *at):
    """A list of content blocks, each an object with a `type` (and a string `text` when it is a text block)."""
    if not isinstance(value, list):
        raise _wrong_type("a string or a list of content blocks", value, *at)
    for index, block in enumerate(value):
        if not isinstance(block, dict):
            raise _wrong_type("a content block object", block, *at, index)
        if not isinstance(block.get("type"), str):
            raise _wrong_type("a string (the block's type)", block.get("type"), *at, index, "type")
        if block["type"] == "text" and not isinstance(block.get("text"), str):
            raise _wrong_type("a string", block.get("text"), *at, index, "text")


def _system(value, params, catalog):
    if not isinstance(value, str):
        _blocks(value)


def _within(low, high):
    def rule(value, params, catalog):
        if not _is_number(value):
            raise _wrong_type("a number", value)
        if not low <= value <= high:
            raise Invalid(f"Input should be between {low} and {high}, but got {value}.")

    return rule


def _top_k(value, params, catalog):
    if not _is_int(value):
        raise _wrong_type("an integer", value)
    if value < 0:
        raise Invalid(f"Input should be greater than or equal to 0, but got {value}.")


def _stop_sequences(value, params, catalog):
    if not isinstance(value, list):
        raise _wrong_type("a list of strings", value)
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise _wrong_type("a string", item, index)


def _stream(value, params, catalog):
    if value is not False:
        raise Invalid("Streaming is not supported in the Batch API; leave 'stream' out.", code="streaming_unsupported")


def _tools(value, params, catalog):
    if not isinstance(value, list):
        raise _wrong_type("a list of tools", value)
    for index, tool in enumerate(value):
        if not isinstance(tool, dict):
            raise _wrong_type("a tool object", tool, index)
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise _wrong_type("a non-empty string (the tool's name)", tool.get("name"), index, "name")


def _tool_choice(value, params, catalog):
    if not isinstance(value, dict):
        raise _wrong_type("an object", value)
    if value.get("type") not in TOOL_CHOICES:
        raise Invalid(
            f"Input should be one of {', '.join(repr(c) for c in TOOL_CHOICES)}, but got {shown(value.get('type'))}.",
            "type",
        )
    if value["type"] == "tool" and not isinstance(value.get("name"), str):
        raise _wrong_type("a string (the tool to call)", value.get("name"), "name")


def _object(value, params, catalog):
    if not isinstance(value, dict):
        raise _wrong_type("an object", value)


REQUIRED = ("model", "max_tokens", "messages")
# Field -> check(value, params, catalog), run in this order: max_tokens reads the model checked before it.
FIELDS = {
    "model": _model,
    "max_tokens": _max_tokens,
    "messages": _messages,
    "system": _system,
    "temperature": _within(0, 1),
    "top_p": _within(0, 1),
    "top_k": _top_k,
    "stop_sequences": _stop_sequences,
    "stream": _stream,
    "tools": _tools,
    "tool_choice": _tool_choice,
    "metadata": _object,
}
