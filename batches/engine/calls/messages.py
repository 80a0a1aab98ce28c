"""Anthropic Messages requests on deployments that only serve chat completions: the request
translated to `/v1/chat/completions` and the answer back to a Message, both ways faithful for
what the two formats share (system, text and image content, tool_use / tool_result, stop
reasons, usage).

What has no chat equivalent is left out of the request: `thinking` (the chat server reasons
its own way), `top_k` only where set (vLLM and llama.cpp read it), server tools (they run at
Anthropic) and cache_control marks (a chat server caches prefixes by itself). A deployment
set to `native` gets the body as written instead (batches.engine.calls.caller).

Usage maps one to one: a chat answer's cached prompt tokens are a Message's
`cache_read_input_tokens`, and its `input_tokens` are the rest (Anthropic counts them apart).
"""

import os

import orjson

from batches.endpoints import anthropic, openai

MESSAGES = anthropic.MESSAGES.path
CHAT = openai.CHAT.path

# Chat finish_reason -> Message stop_reason.
STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}
# Messages parameters sent under the same name.
SAME_NAME = ("temperature", "top_p", "top_k")


# ---------------------------------------------------------------- the request


def chat_request(body):
    """A Messages request body as a chat completions body."""
    chat = {"model": body.get("model"), "messages": _system(body.get("system")) + _messages(body.get("messages"))}
    if body.get("max_tokens") is not None:
        chat["max_tokens"] = body["max_tokens"]
    for name in SAME_NAME:
        if body.get(name) is not None:
            chat[name] = body[name]
    if body.get("stop_sequences"):
        chat["stop"] = body["stop_sequences"]
    user = (body.get("metadata") or {}).get("user_id") if isinstance(body.get("metadata"), dict) else None
    if isinstance(user, str) and user:
        chat["user"] = user
    tools = [_tool(tool) for tool in body.get("tools") or () if _is_client_tool(tool)]
    if tools:
        chat["tools"] = tools
        _tool_choice(body.get("tool_choice"), chat)
    return chat


def _system(system):
    text = _text_of(system)
    return [{"role": "system", "content": text}] if text else []


def _text_of(content):
    """A string, or the text of a list of blocks joined (system prompts, tool results)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n\n".join(b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str))
    return ""


def _messages(messages):
    out = []
    for message in messages or ():
        if not isinstance(message, dict):
            continue
        if message.get("role") == "assistant":
            out.append(_assistant(message.get("content")))
        else:
            out.extend(_user(message.get("content")))
    return out


def _assistant(content):
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts, calls = [], []
    for block in content or ():
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(block.get("text") or "")
        elif kind == "tool_use":
            calls.append(
                {
                    "id": block.get("id"),
                    "type": "function",
                    "function": {"name": block.get("name"), "arguments": orjson.dumps(block.get("input", {})).decode()},
                }
            )
    message = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    return message


def _user(content):
    """A user turn: its tool results first (chat answers tool calls with `tool` messages that must
    follow the assistant turn directly), then what the user said, if anything."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    results, parts = [], []
    for block in content or ():
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_result":
            text = _text_of(block.get("content"))
            if block.get("is_error"):
                text = f"Error: {text}"
            results.append({"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": text})
        elif kind == "text":
            parts.append({"type": "text", "text": block.get("text") or ""})
        elif kind == "image":
            image = _image_url(block.get("source"))
            if image:
                parts.append({"type": "image_url", "image_url": {"url": image}})
        elif kind == "document":
            source = block.get("source") if isinstance(block.get("source"), dict) else {}
            if source.get("type") == "text" and isinstance(source.get("data"), str):
                parts.append({"type": "text", "text": source["data"]})
    if parts:
        only_text = all(part["type"] == "text" for part in parts)
        results.append(
            {"role": "user", "content": "".join(p["text"] for p in parts) if only_text and len(parts) == 1 else parts}
        )
    return results


def _image_url(source):
    if not isinstance(source, dict):
        return None
    if source.get("type") == "base64":
        return f"data:{source.get('media_type')};base64,{source.get('data')}"
    if source.get("type") == "url":
        return source.get("url")
    return None


def _is_client_tool(tool):
    # Server tools (web search, code execution...) carry a versioned type and run at Anthropic.
    return isinstance(tool, dict) and isinstance(tool.get("name"), str) and tool.get("type") in (None, "custom")


def _tool(tool):
    function = {"name": tool["name"], "parameters": tool.get("input_schema") or {"type": "object"}}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice, chat):
    if not isinstance(choice, dict):
        return
    kind = choice.get("type")
    if kind in ("auto", "none"):
        chat["tool_choice"] = kind
    elif kind == "any":
        chat["tool_choice"] = "required"
    elif kind == "tool" and isinstance(choice.get("name"), str):
        chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    if choice.get("disable_parallel_tool_use"):
        chat["parallel_tool_calls"] = False


# ---------------------------------------------------------------- the answer


def message_answer(chat, asked, stop_sequences=None):
    """A chat completion as a Message (`asked`: the catalog model the request named).
    None when `chat` holds no choice to read."""
    try:
        choice = chat["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError):
        return None
    if not isinstance(message, dict):
        return None
    content = _content(message)
    stop_reason, stop_sequence = _stop(choice, content, stop_sequences)
    return {
        "id": _message_id(chat.get("id")),
        "type": "message",
        "role": "assistant",
        "model": asked,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": anthropic_usage(chat.get("usage")),
    }


def _message_id(chat_id):
    suffix = chat_id.removeprefix("chatcmpl-") if isinstance(chat_id, str) and chat_id else os.urandom(12).hex()
    return f"msg_{suffix}"


def _content(message):
    blocks = []
    text = message.get("content")
    if isinstance(text, list):  # some servers answer in parts
        text = "".join(p.get("text") or "" for p in text if isinstance(p, dict))
    if isinstance(text, str) and text:
        blocks.append({"type": "text", "text": text})
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            continue
        blocks.append(
            {"type": "tool_use", "id": call.get("id"), "name": function.get("name"), "input": _input(function)}
        )
    return blocks


def _input(function):
    """A tool call's arguments as the object a tool_use block carries ({} when they are not one)."""
    arguments = function.get("arguments")
    if isinstance(arguments, dict):
        return arguments
    try:
        value = orjson.loads(arguments or "{}")
    except (orjson.JSONDecodeError, TypeError):
        return {}
    return value if isinstance(value, dict) else {}


def _stop(choice, content, stop_sequences):
    reason = STOP_REASONS.get(choice.get("finish_reason"), "end_turn")
    if any(block["type"] == "tool_use" for block in content):
        return "tool_use", None  # vLLM's and llama.cpp's parsers may say "stop" for a tool call
    # vLLM names the stop string it matched in the choice's `stop_reason`.
    matched = choice.get("stop_reason")
    if reason == "end_turn" and isinstance(matched, str) and matched in (stop_sequences or ()):
        return "stop_sequence", matched
    return reason, None


def anthropic_usage(usage):
    """A chat `usage` as a Message's: cached prompt tokens read from the cache, the rest input."""
    usage = usage if isinstance(usage, dict) else {}
    prompt, output = _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
    details = usage.get("prompt_tokens_details")
    cached = min(prompt, _count(details.get("cached_tokens"))) if isinstance(details, dict) else 0
    return {
        "input_tokens": prompt - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": output,
        "service_tier": "batch",
    }


def _count(value):
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


# ---------------------------------------------------------------- one call's result


def as_message(result, asked, request, *, translated):
    """A Messages call's result (caller.CallResult) with a 2xx body as a Message: translated back from
    chat, or the server's own Message with `service_tier: "batch"`. Error answers are kept as the
    server gave them (the results in Anthropic's shape wrap them). A translated 2xx without a choice is
    a failed server, as a 2xx that is not JSON is."""
    if not result.ok or not isinstance(result.body, dict):
        return result
    if not translated:
        usage = result.body.get("usage")
        if isinstance(usage, dict):
            usage["service_tier"] = "batch"
        return result
    message = message_answer(result.body, asked, request.get("stop_sequences"))
    if message is None:
        result.kind, result.status_code, result.body = "unavailable", None, None
        result.message = "The model server answered a chat completion without a choice to translate."
        return result
    result.body = message
    return result
