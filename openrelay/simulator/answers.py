"""The answer to each model call.

Each is a plain dict built from the request body: chat completions (with their
tool calls), completions, responses, moderations and embeddings, deterministic
apart from `id` and `created`. Also the token rule they count with
(`count_tokens`, `usage_block`, the caps), the checks that refuse a body
(`BadRequest`, answered 400), and `error_envelope`, OpenAI's error shape. No
HTTP here: the server turns these dicts into responses.
"""

from __future__ import annotations

import base64
import hashlib
import math
import os
import struct
import time
from typing import Any

import orjson

from openrelay.simulator.bodies import (
    _is_token_array,
    chat_messages,
    chat_text,
    completion_prompts,
    content_text,
    embedding_inputs,
    message_text,
    moderation_inputs,
    response_inputs,
    response_text,
)
from openrelay.simulator.directives import parse_tool_directives, sized_answer, strip_directives, wanted_tokens
from openrelay.simulator.structured import answers_in, plan_json_answer

ECHO_CHARS = 60
DEFAULT_EMBEDDING_DIMENSIONS = 16


# ---------------------------------------------------------------- token rule


def count_tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / 4))


def cached_tokens_for(prompt_tokens: int) -> int:
    return (prompt_tokens // 2) // 64 * 64


def usage_block(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {
            "cached_tokens": cached_tokens_for(prompt_tokens),
            "audio_tokens": 0,
        },
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def cap_answer(text: str, cap: int | None) -> tuple[str, int, str]:
    """Return (text, completion_tokens, finish_reason) under a token cap."""
    tokens = count_tokens(text)
    if cap is not None and tokens > cap:
        return text[: cap * 4], cap, "length"
    return text, tokens, "stop"


# ---------------------------------------------------------------- request checks


class BadRequest(Exception):
    """An invalid request body: answered 400 in OpenAI's envelope."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def _tokens_of(item: Any) -> int:
    return len(item) if _is_token_array(item) else count_tokens(item)


def _require_model(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("you must provide a model parameter", "model")
    return model


def _token_cap(body: dict[str, Any], *names: str) -> int | None:
    for name in names:
        value = body.get(name)
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise BadRequest(f"{name} must be a positive integer", name)
            return value
    return None


def _choice_count(body: dict[str, Any]) -> int:
    n = body.get("n", 1)
    if n is None:
        return 1
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 128:
        raise BadRequest("n must be an integer between 1 and 128", "n")
    return n


def _new_id(prefix: str) -> str:
    return prefix + os.urandom(12).hex()


# ---------------------------------------------------------------- chat answers


def answer_chat(body: dict[str, Any]) -> dict[str, Any]:
    model = _require_model(body)
    messages = chat_messages(body)
    if not messages:
        raise BadRequest("messages must be a non-empty array", "messages")
    if body.get("stream"):
        raise BadRequest("the simulated model server does not stream", "stream")
    prompt_tokens = count_tokens(chat_text(body))
    tool_calls = plan_tool_calls(body, messages)
    if tool_calls is not None:
        choices, completion_tokens = _tool_call_choices(tool_calls, _choice_count(body))
    else:
        choices, completion_tokens = _content_choices(body, messages)
    return {
        "id": _new_id("chatcmpl-"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage_block(prompt_tokens, completion_tokens),
        "service_tier": "default",
        "system_fingerprint": "fp_simulated",
    }


def _content_choices(body: dict[str, Any], messages: list[Any]) -> tuple[list[dict[str, Any]], int]:
    cap = _token_cap(body, "max_completion_tokens", "max_tokens")
    prompt = chat_text(body)
    answer = sized_answer(chat_answer_text(messages), wanted_tokens(prompt))
    planned = plan_json_answer(body, prompt, answers_in(messages), answer)
    text, tokens, finish_reason = cap_answer(planned.text if planned else answer, cap)
    if planned is not None and planned.truncated:
        finish_reason = "length"
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None, "annotations": []}
    n = _choice_count(body)
    choices = [_chat_choice(i, message, finish_reason) for i in range(n)]
    return choices, tokens * n


def _tool_call_choices(tool_calls: list[dict[str, Any]], n: int) -> tuple[list[dict[str, Any]], int]:
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": tool_calls,
        "refusal": None,
        "annotations": [],
    }
    tokens = sum(count_tokens(c["function"]["name"] + c["function"]["arguments"]) for c in tool_calls)
    return [_chat_choice(i, message, "tool_calls") for i in range(n)], tokens * n


def _chat_choice(index: int, message: dict[str, Any], finish_reason: str) -> dict[str, Any]:
    return {
        "index": index,
        "message": message,
        "logprobs": None,
        "finish_reason": finish_reason,
    }


def chat_answer_text(messages: list[Any]) -> str:
    tool_results = [m for m in messages if isinstance(m, dict) and m.get("role") == "tool"]
    if tool_results:
        return "Final answer using: " + content_text(tool_results[-1].get("content"))
    users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    question = strip_directives(content_text(users[-1].get("content"))) if users else ""
    return "Simulated answer to: " + question[:ECHO_CHARS]


# ---------------------------------------------------------------- tool calls


def plan_tool_calls(body: dict[str, Any], messages: list[Any]) -> list[dict[str, Any]] | None:
    """The tool calls of this turn, or None when the model should answer."""
    tools = function_tools(body)
    if not tools or body.get("tool_choice") == "none":
        return None
    user_text = "\n".join(
        content_text(m.get("content")) for m in messages if isinstance(m, dict) and m.get("role") == "user"
    )
    wanted = parse_tool_directives(user_text)
    rounds_done = sum(
        1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant" and m.get("tool_calls")
    )
    if rounds_done >= wanted.rounds:
        return None
    tools = _forced_tool(body, tools) or tools
    return [tool_call(rounds_done, i, tools[i % len(tools)], wanted.arguments) for i in range(wanted.calls)]


def function_tools(body: dict[str, Any]) -> list[dict[str, Any]]:
    tools = body.get("tools")
    if not isinstance(tools, list):
        return []
    return [
        t["function"]
        for t in tools
        if isinstance(t, dict) and isinstance(t.get("function"), dict) and isinstance(t["function"].get("name"), str)
    ]


def _forced_tool(body: dict[str, Any], tools: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    choice = body.get("tool_choice")
    if not isinstance(choice, dict):
        return None
    name = (choice.get("function") or {}).get("name")
    named = [t for t in tools if t["name"] == name]
    return named or None


def tool_call(
    round_index: int, index: int, function: dict[str, Any], arguments: dict[str, Any] | None
) -> dict[str, Any]:
    if arguments is None:
        arguments = arguments_from_schema(function.get("parameters"))
    return {
        "id": f"call_{round_index}_{index}",
        "type": "function",
        "function": {"name": function["name"], "arguments": orjson.dumps(arguments).decode()},
    }


_SAMPLE_BY_TYPE = {"string": "sim", "integer": 1, "number": 1.5, "boolean": True}


def arguments_from_schema(parameters: Any) -> dict[str, Any]:
    properties = parameters.get("properties") if isinstance(parameters, dict) else None
    if not isinstance(properties, dict):
        return {}
    return {name: _sample_value(schema) for name, schema in properties.items()}


def _sample_value(schema: Any) -> Any:
    if not isinstance(schema, dict):
        return None
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    kind = schema.get("type")
    if isinstance(kind, list):  # e.g. ["string", "null"]
        kind = next((k for k in kind if k != "null"), None)
    return _SAMPLE_BY_TYPE.get(kind) if isinstance(kind, str) else None


# ---------------------------------------------------------------- completions


def answer_completion(body: dict[str, Any]) -> dict[str, Any]:
    model = _require_model(body)
    prompts = completion_prompts(body)
    if not prompts or not all(isinstance(p, str) or _is_token_array(p) for p in prompts):
        raise BadRequest("prompt must be a string, an array of strings or tokens", "prompt")
    if body.get("stream"):
        raise BadRequest("the simulated model server does not stream", "stream")
    cap = _token_cap(body, "max_tokens")
    n = _choice_count(body)
    choices: list[dict[str, Any]] = []
    completion_tokens = 0
    for prompt in prompts:
        text, tokens, finish_reason = cap_answer(_completion_text_for(prompt), cap)
        for _ in range(n):
            choice = {"text": text, "index": len(choices), "logprobs": None}
            choices.append({**choice, "finish_reason": finish_reason})
            completion_tokens += tokens
    return {
        "id": _new_id("cmpl-"),
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage_block(sum(_tokens_of(p) for p in prompts), completion_tokens),
        "system_fingerprint": "fp_simulated",
    }


def _completion_text_for(prompt: str | list[Any]) -> str:
    if isinstance(prompt, list):
        return f"Simulated completion of {len(prompt)} tokens"
    answer = "Simulated completion of: " + strip_directives(prompt)[:ECHO_CHARS]
    return sized_answer(answer, wanted_tokens(prompt))


# ---------------------------------------------------------------- responses

REASONING_TOKENS = {"minimal": 0, "low": 16, "medium": 64, "high": 256}


def answer_responses(body: dict[str, Any]) -> dict[str, Any]:
    model = _require_model(body)
    inputs = response_inputs(body)
    if not inputs:
        raise BadRequest("input must be a non-empty string or array of input items", "input")
    if body.get("stream"):
        raise BadRequest("the simulated model server does not stream", "stream")
    if body.get("previous_response_id"):
        raise BadRequest("the simulated model server stores no responses", "previous_response_id")
    last_user = next((message_text(i) for i in reversed(inputs) if i.get("role", "user") == "user"), "")
    cap = _token_cap(body, "max_output_tokens")
    reasoning = _reasoning_tokens(body)
    answer = "Simulated response to: " + strip_directives(last_user)[:ECHO_CHARS]
    answer = sized_answer(answer, wanted_tokens(response_text(body)))
    planned = plan_json_answer(body, response_text(body), answers_in(inputs), answer, responses=True)
    text, tokens, finish_reason = cap_answer(planned.text if planned else answer, cap)
    if planned is not None and planned.truncated:
        finish_reason = "length"
    output: list[dict[str, Any]] = [] if not reasoning else [{"type": "reasoning", "id": _new_id("rs_"), "summary": []}]
    output.append(
        {
            "type": "message",
            "id": _new_id("msg_"),
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
    )
    prompt_tokens = count_tokens(response_text(body))
    incomplete = finish_reason == "length"
    return {
        "id": _new_id("resp_"),
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if incomplete else "completed",
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": cap,
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": (body.get("reasoning") or {}).get("effort"), "summary": None},
        "store": False,
        "temperature": body.get("temperature", 1.0),
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": body.get("top_p", 1.0),
        "truncation": "disabled",
        "usage": {
            "input_tokens": prompt_tokens,
            # cache_write_tokens: the openai SDK's Response type requires it (3.x); the simulator writes no cache.
            "input_tokens_details": {"cached_tokens": cached_tokens_for(prompt_tokens), "cache_write_tokens": 0},
            "output_tokens": tokens + reasoning,
            "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": prompt_tokens + tokens + reasoning,
        },
        "metadata": body.get("metadata") or {},
    }


def _reasoning_tokens(body: dict[str, Any]) -> int:
    reasoning = body.get("reasoning")
    if reasoning is None:
        return 0
    effort = reasoning.get("effort") if isinstance(reasoning, dict) else None
    if effort is not None and effort not in REASONING_TOKENS:
        raise BadRequest(f"reasoning.effort must be one of {', '.join(REASONING_TOKENS)}", "reasoning.effort")
    return REASONING_TOKENS.get(effort or "medium", 0)


# ---------------------------------------------------------------- moderations

MODERATION_CATEGORIES = (
    "harassment",
    "harassment/threatening",
    "hate",
    "hate/threatening",
    "illicit",
    "illicit/violent",
    "self-harm",
    "self-harm/intent",
    "self-harm/instructions",
    "sexual",
    "sexual/minors",
    "violence",
    "violence/graphic",
)


# The categories OpenAI's omni moderation model also scores images for; the rest take text only.
IMAGE_CATEGORIES = frozenset(
    ("self-harm", "self-harm/intent", "self-harm/instructions", "sexual", "violence", "violence/graphic")
)


def answer_moderations(body: dict[str, Any]) -> dict[str, Any]:
    model = _require_model(body)
    inputs = moderation_inputs(body)
    if not inputs or not all((isinstance(i, str) and i) or isinstance(i, dict) for i in inputs):
        raise BadRequest("input must be a non-empty string, an array of strings or of input parts", "input")
    return {"id": _new_id("modr-"), "model": model, "results": [_moderation(item) for item in inputs]}


def _moderation(item: Any) -> dict[str, Any]:
    raw = hashlib.shake_256(orjson.dumps(item)).digest(len(MODERATION_CATEGORIES))
    scores = {name: round(byte / 25500, 6) for name, byte in zip(MODERATION_CATEGORIES, raw)}
    return {
        "flagged": False,
        "categories": dict.fromkeys(MODERATION_CATEGORIES, False),
        "category_scores": scores,
        "category_applied_input_types": _applied_input_types(item),
    }


def _applied_input_types(item: Any) -> dict[str, list[str]]:
    """Which kind of input each category was scored on, as OpenAI reports it: text, or an image part."""
    if isinstance(item, dict) and item.get("type") == "image_url":
        return {name: ["image"] if name in IMAGE_CATEGORIES else [] for name in MODERATION_CATEGORIES}
    return {name: ["text"] for name in MODERATION_CATEGORIES}


# ---------------------------------------------------------------- embeddings


def answer_embeddings(body: dict[str, Any]) -> dict[str, Any]:
    model = _require_model(body)
    inputs = embedding_inputs(body)
    if not inputs or not all((isinstance(i, str) and i) or _is_token_array(i) for i in inputs):
        raise BadRequest("input must be a non-empty string or array of strings", "input")
    dimensions = body.get("dimensions") or DEFAULT_EMBEDDING_DIMENSIONS
    if not isinstance(dimensions, int) or not 1 <= dimensions <= 8192:
        raise BadRequest("dimensions must be an integer between 1 and 8192", "dimensions")
    as_base64 = body.get("encoding_format") == "base64"
    data = [
        {"object": "embedding", "index": i, "embedding": _encoded(vector, as_base64)}
        for i, vector in enumerate(embedding_vector(item, dimensions) for item in inputs)
    ]
    prompt_tokens = sum(_tokens_of(i) for i in inputs)
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }


def embedding_numbers(body: dict[str, Any]) -> int:
    """How many numbers an embeddings answer carries (inputs x dimensions; 0 for a body it refuses)."""
    inputs, dimensions = body.get("input"), body.get("dimensions") or DEFAULT_EMBEDDING_DIMENSIONS
    if not isinstance(dimensions, int) or not isinstance(inputs, list):
        return 0
    return len(inputs) * dimensions


def built_apart(answer: Any, body: dict[str, Any]) -> tuple[bytes | None, Any, tuple[str, str | None] | None]:
    """`answer(body)` as its JSON text, in a child process (server.ModelServer._built): (text, its
    usage, None), or (None, None, (message, param)) for a body it refuses."""
    try:
        payload = answer(body)
    except BadRequest as exc:
        return None, None, (str(exc), exc.param)
    return orjson.dumps(payload), payload.get("usage"), None


def embedding_vector(item: str | list[Any], dimensions: int) -> list[float]:
    """A unit vector whose components come from a hash of the input."""
    seed = item.encode() if isinstance(item, str) else orjson.dumps(item)
    raw = hashlib.shake_256(seed).digest(2 * dimensions)
    components = [v / 32767.5 - 1.0 for v in struct.unpack(f"<{dimensions}H", raw)]
    norm = math.sqrt(sum(c * c for c in components)) or 1.0
    return [c / norm for c in components]


def _encoded(vector: list[float], as_base64: bool) -> list[float] | str:
    if not as_base64:
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


# ---------------------------------------------------------------- errors

# (type, code, message) per status, after OpenAI's own answers.
_ERROR_SHAPES = {
    400: ("invalid_request_error", None, "Invalid request."),
    401: ("invalid_request_error", "invalid_api_key", "Incorrect API key provided."),
    403: ("permission_error", None, "You are not allowed to use this model."),
    404: ("invalid_request_error", "model_not_found", "The model does not exist."),
    408: ("timeout", None, "Request timed out."),
    409: ("invalid_request_error", "conflict", "Conflicting request."),
    422: ("invalid_request_error", None, "Unprocessable request."),
    429: ("requests", "rate_limit_exceeded", "Rate limit reached for requests."),
    500: ("server_error", None, "The server had an error while processing your request."),
    502: ("server_error", None, "Bad gateway."),
    503: ("server_error", None, "The engine is currently overloaded, please try again later."),
    504: ("server_error", None, "The server timed out."),
}


def error_envelope(status: int, message: str | None = None, param: str | None = None) -> dict[str, Any]:
    kind, code, default_message = _ERROR_SHAPES.get(
        status,
        ("server_error" if status >= 500 else "invalid_request_error", None, "Simulated error."),
    )
    return {
        "error": {
            "message": message or f"Simulated {status}: {default_message}",
            "type": kind,
            "param": param,
            "code": code,
        }
    }
