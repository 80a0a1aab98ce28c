"""Reading a request body.

The messages, prompts and inputs of each endpoint's body and the text they
carry, tolerant of any shape (a value of the wrong type reads as empty, the
answers refuse it). The answers count and echo this text, the server searches
it for directives, and the capacity model's prefix cache reads the prompt
through it.
"""

from __future__ import annotations

from typing import Any


def content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text") or "" for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def message_text(message: Any) -> str:
    if not isinstance(message, dict):
        return ""
    text = content_text(message.get("content"))
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            text += str(function.get("name") or "") + str(function.get("arguments") or "")
    return text


def chat_messages(body: dict[str, Any]) -> list[Any]:
    messages = body.get("messages")
    return messages if isinstance(messages, list) else []


def chat_text(body: dict[str, Any]) -> str:
    return "\n".join(message_text(m) for m in chat_messages(body))


def completion_prompts(body: dict[str, Any]) -> list[Any]:
    prompt = body.get("prompt")
    # A list of ints is one prompt given as tokens, not several prompts.
    if isinstance(prompt, str) or _is_token_array(prompt):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        return prompt
    return []


def completion_text(body: dict[str, Any]) -> str:
    return "\n".join(p for p in completion_prompts(body) if isinstance(p, str))


def embedding_inputs(body: dict[str, Any]) -> list[Any]:
    value = body.get("input")
    if isinstance(value, str) or _is_token_array(value):
        return [value]
    return value if isinstance(value, list) else []


def embedding_text(body: dict[str, Any]) -> str:
    return "\n".join(i for i in embedding_inputs(body) if isinstance(i, str))


def response_inputs(body: dict[str, Any]) -> list[Any]:
    """The Responses API's `input`: a string, or items (messages with string or part content)."""
    value = body.get("input")
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def response_text(body: dict[str, Any]) -> str:
    instructions = body.get("instructions")
    if not isinstance(instructions, str):
        instructions = ""
    return "\n".join([instructions, *(message_text(item) for item in response_inputs(body))]).strip("\n")


def moderation_inputs(body: dict[str, Any]) -> list[Any]:
    value = body.get("input")
    if isinstance(value, str):
        return [value]
    return value if isinstance(value, list) else []


def moderation_text(body: dict[str, Any]) -> str:
    return "\n".join(i if isinstance(i, str) else content_text([i]) for i in moderation_inputs(body))


def _is_token_array(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(t, int) for t in value)
