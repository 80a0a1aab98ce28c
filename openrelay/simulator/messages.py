"""`POST /v1/messages`: Anthropic's Messages API, as vLLM, llama.cpp and Ollama serve it.

The same token rule, directives and tool behaviour as chat completions (answers.py), in
Anthropic's shapes: a system prompt beside the messages, content blocks, tools as
`{name, description, input_schema}`, `tool_use` blocks asked for and `tool_result` blocks
answered, `stop_reason`, and usage with the prompt cache's part apart
(`cache_read_input_tokens`). Bad bodies answer 400 (answers.BadRequest).
"""

from __future__ import annotations

from typing import Any

from openrelay.simulator.answers import (
    ECHO_CHARS,
    BadRequest,
    _new_id,
    _require_model,
    arguments_from_schema,
    cached_tokens_for,
    cap_answer,
    count_tokens,
)
from openrelay.simulator.bodies import content_text
from openrelay.simulator.directives import parse_tool_directives, sized_answer, strip_directives, wanted_tokens

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _block_text(block: dict[str, Any]) -> str:
    kind = block.get("type")
    if kind == "text":
        text = block.get("text")
        return text if isinstance(text, str) else ""
    if kind == "tool_use":
        return str(block.get("name") or "") + str(block.get("input") or "")
    if kind == "tool_result":
        return content_text(block.get("content"))
    return ""


def message_list(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    return [m for m in messages if isinstance(m, dict)] if isinstance(messages, list) else []


def messages_text(body: dict[str, Any]) -> str:
    """The request's text: its system prompt and every block of every message."""
    parts = [content_text(body.get("system"))] if body.get("system") else []
    parts += ["".join(_block_text(b) for b in _blocks(m.get("content"))) for m in message_list(body)]
    return "\n".join(parts)


def answer_messages(body: dict[str, Any]) -> dict[str, Any]:
    model = _require_model(body)
    messages = message_list(body)
    if not messages:
        raise BadRequest("messages: Field required", "messages")
    cap = body.get("max_tokens")
    if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
        raise BadRequest("max_tokens: Field required (an integer of at least 1)", "max_tokens")
    if body.get("stream"):
        raise BadRequest("the simulated model server does not stream", "stream")
    prompt_tokens = count_tokens(messages_text(body))
    uses = _planned_tool_uses(body, messages)
    if uses is not None:
        content: list[dict[str, Any]] = uses
        stop_reason = "tool_use"
        output_tokens = sum(count_tokens(u["name"] + str(u["input"])) for u in uses)
    else:
        answer = sized_answer(_answer_text(messages), wanted_tokens(messages_text(body)))
        text, output_tokens, finish = cap_answer(answer, cap)
        content, stop_reason = [{"type": "text", "text": text}], STOP_REASONS[finish]
    cached = cached_tokens_for(prompt_tokens)
    return {
        "id": _new_id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {
            "input_tokens": prompt_tokens - cached,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached,
            "output_tokens": output_tokens,
            "service_tier": "standard",
        },
    }


def _answer_text(messages: list[dict[str, Any]]) -> str:
    last = messages[-1]
    results = [b for b in _blocks(last.get("content")) if b.get("type") == "tool_result"]
    if results:
        return "Final answer using: " + content_text(results[-1].get("content"))
    users = [m for m in messages if m.get("role") == "user"]
    question = strip_directives(content_text(users[-1].get("content"))) if users else ""
    return "Simulated answer to: " + question[:ECHO_CHARS]


def _planned_tool_uses(body: dict[str, Any], messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """This turn's tool_use blocks, or None when the model should answer (the chat answers' rule)."""
    tools = [t for t in body.get("tools") or () if isinstance(t, dict) and isinstance(t.get("name"), str)]
    choice = body.get("tool_choice")
    if not tools or (isinstance(choice, dict) and choice.get("type") == "none"):
        return None
    user_text = "\n".join(
        "".join(_block_text(b) for b in _blocks(m.get("content")) if b.get("type") == "text")
        for m in messages
        if m.get("role") == "user"
    )
    wanted = parse_tool_directives(user_text)
    rounds_done = sum(
        1
        for m in messages
        if m.get("role") == "assistant" and any(b.get("type") == "tool_use" for b in _blocks(m.get("content")))
    )
    if rounds_done >= wanted.rounds:
        return None
    if isinstance(choice, dict) and choice.get("type") == "tool":
        tools = [t for t in tools if t["name"] == choice.get("name")] or tools
    uses = []
    for i in range(wanted.calls):
        tool = tools[i % len(tools)]
        arguments = (
            wanted.arguments if wanted.arguments is not None else arguments_from_schema(tool.get("input_schema"))
        )
        uses.append({"type": "tool_use", "id": f"toolu_{rounds_done}_{i}", "name": tool["name"], "input": arguments})
    return uses
