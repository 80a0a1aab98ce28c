"""Simulated OpenAI-compatible model server.

The embedded default upstream on a fresh machine, the model server of every
test, and the peer of the load benchmarks. It speaks just enough of the OpenAI
API to be indistinguishable from a real deployment for a batch gateway, and
its answers are deterministic: the same request body always gets the same
answer, apart from `id` and `created`.

Endpoints
---------
- `POST /v1/chat/completions`, `POST /v1/completions`, `POST /v1/embeddings`,
  `POST /v1/responses`, `POST /v1/moderations`
- `GET /v1/models`
- `GET /_sim/requests`: the recorded model calls, oldest first, each
  `{"path", "headers", "body"}`; secret headers (`authorization`, `api-key`,
  `x-api-key`, `proxy-authorization`, `cookie`) are never recorded. Only the
  last `record_limit` (10,000) calls are kept; `record=False` turns it off.
- `POST /_sim/reset`: forget the recorded calls and the per-body counters
  (and zero the capacity model's figures, empty its prefix cache).
- `GET /_sim/stats`: the capacity model's figures (see "Capacity model").
- `GET /metrics`: only with `metrics` set (404 otherwise, as before).

Token rule
----------
- A text costs `max(1, ceil(len(text) / 4))` tokens (about 4 characters a
  token). A prompt given as a token array costs one token per element.
- Chat `prompt_tokens` count the text of every message (string content or the
  `text` of content parts, plus the name and arguments of earlier tool calls).
- `cached_tokens` = `prompt_tokens // 2` rounded down to a multiple of 64
  (so prompts under 128 tokens have none) without the capacity model; with
  it, what its prefix cache held. `reasoning_tokens` is always 0.
- `completion_tokens` count the answer text (for tool calls: each function's
  name plus its arguments). `max_tokens` / `max_completion_tokens` cap them;
  a capped answer is cut to `4 * cap` characters and ends with
  `finish_reason: "length"`. Tool-call turns are never capped.
- `[[tokens:N]]` in the text (for completions, in that prompt) makes the
  answer exactly N completion tokens: the echo padded with " sim" (one token
  each) or cut to `4 * N` characters; the caps above still apply. Tool-call
  turns ignore it.

Answers
-------
- chat: `"Simulated answer to: <first 60 chars of the last user message>"`
  (directives removed from the echo), `n` choices if `n` is given.
- completions: `"Simulated completion of: <first 60 chars of the prompt>"`,
  one choice per prompt.
- responses: a `response` object whose one `message` output item says
  `"Simulated response to: <first 60 chars of the last user input>"`, with
  usage in the Responses shape (`input_tokens`, `output_tokens`, details).
  `instructions` count as input; `max_output_tokens` caps the answer
  (`status: "incomplete"`, `incomplete_details.reason: "max_output_tokens"`);
  `reasoning.effort` adds a `reasoning` output item and `reasoning_tokens`
  (low 16, medium 64, high 256; a `reasoning` object without an effort is
  medium, `minimal` is 0), counted in `output_tokens`.
- moderations: one result an input, never flagged, every category score
  below 0.01 (derived from a hash of the input); no `usage`, as OpenAI's.
- embeddings: unit-length float vectors derived from a hash of each input
  (string or list of strings, or token arrays), 16 dimensions unless
  `dimensions` says otherwise; `encoding_format: "base64"` is honoured.

Tool calls
----------
When a chat request carries a non-empty `tools` list (and `tool_choice` is not
`"none"`), the simulator asks for tools while the number of tool rounds
already in the conversation (assistant messages with `tool_calls`) is below
the wanted number of rounds. It then answers with `finish_reason:
"tool_calls"` and tool calls with ids `call_<round>_<i>` (both from 0), type
`function`, and `arguments` as a JSON string. After that (or when a `tool`
message is present and no call is wanted) it answers
`"Final answer using: <content of the last role=tool message>"`.

- The first tool is called by default; `tool_choice: {"type": "function",
  "function": {"name": X}}` forces tool X.
- Arguments are built from the tool's `parameters.properties`: string ->
  `"sim"`, integer -> 1, number -> 1.5, boolean -> true, a property with an
  `enum` -> its first value, anything else -> null.

Directives in user messages (tool behaviour):
- `[[tool_rounds:N]]`: want N tool rounds (default 1; N=99 never finishes).
- `[[tool_calls:K]]`: K parallel calls per turn, cycling over the tools.
- `[[tool_args:{...json...}]]`: use this object as the arguments.

Faults
------
Directives in the text of any message (for completions the prompt, for
embeddings the input), so one batch can mix outcomes deterministically. A
directive in a `tool` message affects the next model call of the loop.
- `[[status:NNN]]`: answer HTTP NNN with an OpenAI error envelope
  `{"error": {"message", "type", "param", "code"}}`; a 404 names the model
  asked for, as vLLM's does ("The model `X` does not exist.").
- `[[status:NNNxK]]`: answer NNN the first K times this exact body is seen,
  then answer normally ("failed server, the rerun succeeds").
- `[[drop]]` / `[[dropxK]]`: close the connection without an answer (always /
  the first K times this exact body is seen).
- `[[hang]]`: never answer (until the client gives up or the server stops).
- `[[latency:MS]]`: wait MS milliseconds before answering.
Every 429 carries `Retry-After: <retry_after_s or 1>` (seconds, may be
fractional) and `retry-after-ms`.

Server-wide knobs (`SimulatorConfig`, or the command-line flags):
`latency_ms` (added to every answer), `error_rates` ({status: probability}),
`drop_rate`, `hang_rate`, `retry_after_s`, `seed`, `fail_all_status` (every
request gets that status: a dead deployment), `drop_all` (every connection is
dropped), `api_key` (when set, a request without `Authorization: Bearer <it>`
gets 401, as vLLM's `--api-key` answers), `record`, `record_limit`, `models` (listed by `/v1/models`),
and the capacity model's (below).
The random draw for a request is seeded by (seed, body hash, how many times
that body was seen), so a run is reproducible even when requests arrive
concurrently in a different order, and a retried body gets a fresh draw.

Capacity model
--------------
Off while `slots` is 0: then every request is answered as soon as it arrives
(after `latency_ms`), however many there are. With `slots` N > 0 the server
has one GPU's shape (vLLM's `max_num_seqs`, llama.cpp's `--parallel`):
- At most N requests hold a slot at once; the others wait in a FIFO queue.
  When `queue_limit` requests are already waiting, a new one gets 503 at
  once ("The server is overloaded: N requests are waiting.", the error
  envelope, `Retry-After: <retry_after_s or 1>`); `queue_limit` None queues
  without limit, as llama.cpp defers.
- A request holding a slot prefills, `prefill_ms_per_token` for each
  uncached prompt token, then decodes, for each completion token it produces
  `decode_ms_per_token * (1 + decode_contention * (busy - 1) / N)`, where
  busy is the slots held when its decode starts (itself included). Queueing
  and prefill count in the latency a client sees. Throughput still grows
  with busy slots up to N (continuous batching) while `decode_contention`
  is below N, and past N requests only queue. `capacity_per_second()` gives
  the most requests a second of a given shape. `latency_ms` and
  `[[latency:MS]]` wait before the queue: they add latency, take no capacity.
- `prefix_cache_tokens` > 0 adds a prefix cache of that many tokens, like
  vLLM's automatic prefix caching. The cache reads a chat as each message's
  role, a newline, its text, a newline; a completion as its prompt; a
  response as "instructions", a newline, its instructions, a newline, then
  its input items as chat messages (embeddings and moderations skip it).
  That text is cut into whole blocks of 64 characters (16 tokens), at most
  `prompt_tokens // 16` of them, each keyed by a hash chained over all the
  blocks before it. A request's `cached_tokens` is 16 times its leading
  blocks found in the cache when it takes its slot; only the rest is
  prefilled. When its prefill ends its blocks go in (or are refreshed) tail
  first, and past capacity the least recently used blocks go out, so a
  shared head outlives the tails behind it. Without a prefix cache nothing
  is cached. Chat and completions report it in
  `usage.prompt_tokens_details.cached_tokens`, responses in
  `usage.input_tokens_details.cached_tokens`.
- `[[status:...]]`, `[[drop]]`, `[[hang]]` and the random faults, a 400 or
  a 401 are answered without a slot. A request whose caller goes away
  leaves the queue or frees its slot; shutdown ends them all.
- A request with several prompts or `n` choices is one request: it holds one
  slot and decodes all its completion tokens.
- `GET /_sim/stats` (and `SimulatorThread.stats()`): `completed`,
  `rejected` (503s of the queue limit), `running`, `waiting`, `max_running`,
  `max_waiting`, `busy_slot_seconds` (busy slots integrated over time),
  `prompt_tokens`, `cached_tokens`, `completion_tokens` of completed
  requests, `prefix_cache_queries` (prompt tokens looked up),
  `prefix_cache_used_tokens`, `slots`, `queue_limit`; the figures stay 0
  while `slots` is 0.
- `metrics="vllm"` serves `GET /metrics` with vLLM's names and types: gauges
  `vllm:num_requests_running`, `vllm:num_requests_waiting`,
  `vllm:kv_cache_usage_perc` and its older name `vllm:gpu_cache_usage_perc`
  (busy slots / N: the simulator keeps no KV blocks), counters
  `vllm:prompt_tokens_total`, `vllm:generation_tokens_total`,
  `vllm:prefix_cache_queries_total`, `vllm:prefix_cache_hits_total` (tokens),
  labelled `model_name` (the first of `models`) and `engine="0"`.
  `metrics="llamacpp"` serves llama-server's: counters
  `llamacpp:prompt_tokens_total` (uncached tokens, what it processed),
  `llamacpp:tokens_predicted_total`, gauges `llamacpp:requests_processing`,
  `llamacpp:requests_deferred`, `llamacpp:kv_cache_usage_ratio`, without
  labels and behind `api_key` (vLLM's key guards /v1 only).

Usage
-----
    python -m openrelay.simulator --port 8001 --error-rate 503=0.1
    python manage.py simulate_model --port 8001 --latency-ms 50
    python -m openrelay.simulator --slots 16 --decode-ms-per-token 20 \
        --prefill-ms-per-token 0.2 --prefix-cache-tokens 200000 --metrics vllm

    with run_in_thread(SimulatorConfig()) as sim:
        sim.base_url   # "http://127.0.0.1:PORT/v1"
        sim.requests() # recorded calls
        sim.stats()    # the capacity model's figures
        sim.reset()

This module must not import Django: it runs standalone too.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import json
import math
import os
import random
import re
import signal
import socket
import struct
import sys
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from openrelay.lib import aio

DEFAULT_MODELS = ("gpt-4o-mini", "gpt-4o", "text-embedding-3-small")
SECRET_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "api-key", "x-api-key", "cookie"}
)
ECHO_CHARS = 60
DEFAULT_EMBEDDING_DIMENSIONS = 16
# Per-body counters only need to outlive a batch's retries; the cap keeps a
# long benchmark with error rates from growing memory without bound.
SEEN_BODIES_LIMIT = 200_000
MODELS_CREATED = 1_700_000_000
METRICS_STYLES = ("", "vllm", "llamacpp")


# ---------------------------------------------------------------- config


@dataclass
class SimulatorConfig:
    latency_ms: float = 0.0
    error_rates: Mapping[int, float] = field(default_factory=dict)
    drop_rate: float = 0.0
    hang_rate: float = 0.0
    retry_after_s: float | None = None
    seed: int = 0
    fail_all_status: int | None = None
    drop_all: bool = False
    api_key: str = ""
    record: bool = True
    record_limit: int = 10_000
    models: tuple[str, ...] = DEFAULT_MODELS
    # The capacity model (off while slots is 0; see "Capacity model" above).
    slots: int = 0
    queue_limit: int | None = None
    prefill_ms_per_token: float = 0.0
    decode_ms_per_token: float = 0.0
    decode_contention: float = 0.0
    prefix_cache_tokens: int = 0
    metrics: str = ""  # "", "vllm" or "llamacpp"

    def __post_init__(self):
        self.error_rates = {int(s): float(p) for s, p in dict(self.error_rates).items()}
        # The random outcomes are exclusive slices of one draw in [0, 1).
        if self.drop_rate + self.hang_rate + sum(self.error_rates.values()) > 1:
            raise ValueError("drop_rate + hang_rate + error_rates must not exceed 1")
        self.models = tuple(self.models)
        self._check_capacity()

    def _check_capacity(self) -> None:
        if self.slots < 0 or self.prefix_cache_tokens < 0 or (self.queue_limit or 0) < 0:
            raise ValueError("slots, queue_limit and prefix_cache_tokens must not be negative")
        if min(self.prefill_ms_per_token, self.decode_ms_per_token, self.decode_contention) < 0:
            raise ValueError("the per-token costs and decode_contention must not be negative")
        if self.metrics not in METRICS_STYLES:
            raise ValueError(f"metrics must be one of {', '.join(repr(m) for m in METRICS_STYLES)}")

    @property
    def draws_at_random(self) -> bool:
        return bool(self.drop_rate or self.hang_rate or any(self.error_rates.values()))


# ---------------------------------------------------------------- token rule


def count_tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / 4))


def cached_tokens_for(prompt_tokens: int) -> int:
    return (prompt_tokens // 2) // 64 * 64


def usage_block(prompt_tokens: int, completion_tokens: int) -> dict:
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


# ---------------------------------------------------------------- directives

_FAULT_DIRECTIVE = re.compile(
    r"\[\[(?:status:(?P<status>\d{3})(?:x(?P<status_times>\d+))?"
    r"|(?P<drop>drop)(?:x(?P<drop_times>\d+))?"
    r"|(?P<hang>hang)"
    r"|latency:(?P<latency>\d+(?:\.\d+)?))\]\]"
)
_TOOL_ROUNDS = re.compile(r"\[\[tool_rounds:(\d+)\]\]")
_TOOL_CALLS = re.compile(r"\[\[tool_calls:(\d+)\]\]")
_TOOL_ARGS_OPENING = "[[tool_args:"
_TOKENS = re.compile(r"\[\[tokens:(\d+)\]\]")
_ANY_DIRECTIVE = re.compile(
    r"\[\[(?:status|drop|hang|latency|tool_rounds|tool_calls|tool_args|tokens)\b.*?\]\]", re.S
)
# Four characters are one token, so " sim" pads an answer one token at a time.
PADDING = " sim"


@dataclass
class FaultDirectives:
    status: int | None = None
    status_times: int | None = None  # None: every time
    drop: bool = False
    drop_times: int | None = None
    hang: bool = False
    latency_ms: float = 0.0

    @property
    def counts_repeats(self) -> bool:
        return self.status_times is not None or self.drop_times is not None


def parse_fault_directives(text: str) -> FaultDirectives:
    """The first directive of each kind wins."""
    found = FaultDirectives()
    if "[[" not in text:  # the common case costs one substring scan
        return found
    for match in _FAULT_DIRECTIVE.finditer(text):
        if match["status"] and found.status is None:
            found.status = int(match["status"])
            found.status_times = _int_or_none(match["status_times"])
        elif match["drop"] and not found.drop:
            found.drop = True
            found.drop_times = _int_or_none(match["drop_times"])
        elif match["hang"]:
            found.hang = True
        elif match["latency"] and not found.latency_ms:
            found.latency_ms = float(match["latency"])
    return found


@dataclass
class ToolDirectives:
    rounds: int = 1
    calls: int = 1
    arguments: dict | None = None


def parse_tool_directives(text: str) -> ToolDirectives:
    found = ToolDirectives()
    if "[[" not in text:
        return found
    if match := _TOOL_ROUNDS.search(text):
        found.rounds = int(match[1])
    if match := _TOOL_CALLS.search(text):
        found.calls = max(1, int(match[1]))
    found.arguments = _literal_tool_arguments(text)
    return found


def _literal_tool_arguments(text: str) -> dict | None:
    # raw_decode instead of a regex: the JSON may itself contain "]]".
    start = text.find(_TOOL_ARGS_OPENING)
    if start < 0:
        return None
    try:
        value, end = json.JSONDecoder().raw_decode(text, start + len(_TOOL_ARGS_OPENING))
    except ValueError:
        return None
    if not text.startswith("]]", end) or not isinstance(value, dict):
        return None
    return value


def wanted_tokens(text: str) -> int | None:
    """The N of a `[[tokens:N]]` directive (at least 1), or None."""
    if "[[" not in text:
        return None
    match = _TOKENS.search(text)
    return max(1, int(match[1])) if match else None


def sized_answer(text: str, tokens: int | None) -> str:
    """The answer padded with " sim" (or cut) to exactly `tokens` tokens."""
    if tokens is None:
        return text
    chars = 4 * tokens
    if len(text) < chars:
        text += PADDING * ((chars - len(text)) // len(PADDING) + 1)
    return text[:chars]


def strip_directives(text: str) -> str:
    if "[[" in text:
        text = _ANY_DIRECTIVE.sub("", text)
    return " ".join(text.split())


def _int_or_none(value: str | None) -> int | None:
    return int(value) if value is not None else None


# ---------------------------------------------------------------- request text


class BadRequest(Exception):
    """An invalid request body: answered 400 in OpenAI's envelope."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text") or ""
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
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


def chat_messages(body: dict) -> list:
    messages = body.get("messages")
    return messages if isinstance(messages, list) else []


def chat_text(body: dict) -> str:
    return "\n".join(message_text(m) for m in chat_messages(body))


def completion_prompts(body: dict) -> list:
    prompt = body.get("prompt")
    # A list of ints is one prompt given as tokens, not several prompts.
    if isinstance(prompt, str) or _is_token_array(prompt):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        return prompt
    return []


def completion_text(body: dict) -> str:
    return "\n".join(p for p in completion_prompts(body) if isinstance(p, str))


def embedding_inputs(body: dict) -> list:
    value = body.get("input")
    if isinstance(value, str) or _is_token_array(value):
        return [value]
    return value if isinstance(value, list) else []


def embedding_text(body: dict) -> str:
    return "\n".join(i for i in embedding_inputs(body) if isinstance(i, str))


def response_inputs(body: dict) -> list:
    """The Responses API's `input`: a string, or items (messages with string or part content)."""
    value = body.get("input")
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def response_text(body: dict) -> str:
    instructions = body.get("instructions") if isinstance(body.get("instructions"), str) else ""
    return "\n".join([instructions, *(message_text(item) for item in response_inputs(body))]).strip("\n")


def moderation_inputs(body: dict) -> list:
    value = body.get("input")
    if isinstance(value, str):
        return [value]
    return value if isinstance(value, list) else []


def moderation_text(body: dict) -> str:
    return "\n".join(i if isinstance(i, str) else content_text([i]) for i in moderation_inputs(body))


def _is_token_array(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(t, int) for t in value)


def _tokens_of(item: Any) -> int:
    return len(item) if _is_token_array(item) else count_tokens(item)


def _require_model(body: dict) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("you must provide a model parameter", "model")
    return model


def _token_cap(body: dict, *names: str) -> int | None:
    for name in names:
        value = body.get(name)
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise BadRequest(f"{name} must be a positive integer", name)
            return value
    return None


def _choice_count(body: dict) -> int:
    n = body.get("n", 1)
    if n is None:
        return 1
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 128:
        raise BadRequest("n must be an integer between 1 and 128", "n")
    return n


def _new_id(prefix: str) -> str:
    return prefix + os.urandom(12).hex()


# ---------------------------------------------------------------- chat answers


def answer_chat(body: dict) -> dict:
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


def _content_choices(body: dict, messages: list) -> tuple[list, int]:
    cap = _token_cap(body, "max_completion_tokens", "max_tokens")
    answer = sized_answer(chat_answer_text(messages), wanted_tokens(chat_text(body)))
    text, tokens, finish_reason = cap_answer(answer, cap)
    message = {"role": "assistant", "content": text, "refusal": None, "annotations": []}
    n = _choice_count(body)
    choices = [_chat_choice(i, message, finish_reason) for i in range(n)]
    return choices, tokens * n


def _tool_call_choices(tool_calls: list, n: int) -> tuple[list, int]:
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": tool_calls,
        "refusal": None,
        "annotations": [],
    }
    tokens = sum(
        count_tokens(c["function"]["name"] + c["function"]["arguments"]) for c in tool_calls
    )
    return [_chat_choice(i, message, "tool_calls") for i in range(n)], tokens * n


def _chat_choice(index: int, message: dict, finish_reason: str) -> dict:
    return {
        "index": index,
        "message": message,
        "logprobs": None,
        "finish_reason": finish_reason,
    }


def chat_answer_text(messages: list) -> str:
    tool_results = [m for m in messages if isinstance(m, dict) and m.get("role") == "tool"]
    if tool_results:
        return "Final answer using: " + content_text(tool_results[-1].get("content"))
    users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    question = strip_directives(content_text(users[-1].get("content"))) if users else ""
    return "Simulated answer to: " + question[:ECHO_CHARS]


# ---------------------------------------------------------------- tool calls


def plan_tool_calls(body: dict, messages: list) -> list | None:
    """The tool calls of this turn, or None when the model should answer."""
    tools = function_tools(body)
    if not tools or body.get("tool_choice") == "none":
        return None
    user_text = "\n".join(
        content_text(m.get("content"))
        for m in messages
        if isinstance(m, dict) and m.get("role") == "user"
    )
    wanted = parse_tool_directives(user_text)
    rounds_done = sum(
        1
        for m in messages
        if isinstance(m, dict) and m.get("role") == "assistant" and m.get("tool_calls")
    )
    if rounds_done >= wanted.rounds:
        return None
    tools = _forced_tool(body, tools) or tools
    return [
        tool_call(rounds_done, i, tools[i % len(tools)], wanted.arguments)
        for i in range(wanted.calls)
    ]


def function_tools(body: dict) -> list[dict]:
    tools = body.get("tools")
    if not isinstance(tools, list):
        return []
    return [
        t["function"]
        for t in tools
        if isinstance(t, dict)
        and isinstance(t.get("function"), dict)
        and isinstance(t["function"].get("name"), str)
    ]


def _forced_tool(body: dict, tools: list[dict]) -> list[dict] | None:
    choice = body.get("tool_choice")
    if not isinstance(choice, dict):
        return None
    name = (choice.get("function") or {}).get("name")
    named = [t for t in tools if t["name"] == name]
    return named or None


def tool_call(round_index: int, index: int, function: dict, arguments: dict | None) -> dict:
    if arguments is None:
        arguments = arguments_from_schema(function.get("parameters"))
    return {
        "id": f"call_{round_index}_{index}",
        "type": "function",
        "function": {"name": function["name"], "arguments": orjson.dumps(arguments).decode()},
    }


_SAMPLE_BY_TYPE = {"string": "sim", "integer": 1, "number": 1.5, "boolean": True}


def arguments_from_schema(parameters: Any) -> dict:
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


def answer_completion(body: dict) -> dict:
    model = _require_model(body)
    prompts = completion_prompts(body)
    if not prompts or not all(isinstance(p, str) or _is_token_array(p) for p in prompts):
        raise BadRequest("prompt must be a string, an array of strings or tokens", "prompt")
    if body.get("stream"):
        raise BadRequest("the simulated model server does not stream", "stream")
    cap = _token_cap(body, "max_tokens")
    n = _choice_count(body)
    choices, completion_tokens = [], 0
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


def _completion_text_for(prompt: str | list) -> str:
    if isinstance(prompt, list):
        return f"Simulated completion of {len(prompt)} tokens"
    answer = "Simulated completion of: " + strip_directives(prompt)[:ECHO_CHARS]
    return sized_answer(answer, wanted_tokens(prompt))


# ---------------------------------------------------------------- responses

REASONING_TOKENS = {"minimal": 0, "low": 16, "medium": 64, "high": 256}


def answer_responses(body: dict) -> dict:
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
    text, tokens, finish_reason = cap_answer(sized_answer(answer, wanted_tokens(response_text(body))), cap)
    output = [] if not reasoning else [{"type": "reasoning", "id": _new_id("rs_"), "summary": []}]
    output.append({"type": "message", "id": _new_id("msg_"), "status": "completed", "role": "assistant",
                   "content": [{"type": "output_text", "text": text, "annotations": []}]})
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
            "input_tokens_details": {"cached_tokens": cached_tokens_for(prompt_tokens)},
            "output_tokens": tokens + reasoning,
            "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": prompt_tokens + tokens + reasoning,
        },
        "metadata": body.get("metadata") or {},
    }


def _reasoning_tokens(body: dict) -> int:
    reasoning = body.get("reasoning")
    if reasoning is None:
        return 0
    effort = reasoning.get("effort") if isinstance(reasoning, dict) else None
    if effort is not None and effort not in REASONING_TOKENS:
        raise BadRequest(f"reasoning.effort must be one of {', '.join(REASONING_TOKENS)}", "reasoning.effort")
    return REASONING_TOKENS.get(effort or "medium", 0)


# ---------------------------------------------------------------- moderations

MODERATION_CATEGORIES = (
    "harassment", "harassment/threatening", "hate", "hate/threatening", "illicit", "illicit/violent",
    "self-harm", "self-harm/intent", "self-harm/instructions", "sexual", "sexual/minors", "violence",
    "violence/graphic",
)


def answer_moderations(body: dict) -> dict:
    model = _require_model(body)
    inputs = moderation_inputs(body)
    if not inputs or not all((isinstance(i, str) and i) or isinstance(i, dict) for i in inputs):
        raise BadRequest("input must be a non-empty string, an array of strings or of input parts", "input")
    return {"id": _new_id("modr-"), "model": model, "results": [_moderation(item) for item in inputs]}


def _moderation(item: Any) -> dict:
    raw = hashlib.shake_256(orjson.dumps(item)).digest(len(MODERATION_CATEGORIES))
    scores = {name: round(byte / 25500, 6) for name, byte in zip(MODERATION_CATEGORIES, raw)}
    return {"flagged": False, "categories": dict.fromkeys(MODERATION_CATEGORIES, False), "category_scores": scores}


# ---------------------------------------------------------------- embeddings


def answer_embeddings(body: dict) -> dict:
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


def embedding_vector(item: str | list, dimensions: int) -> list[float]:
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


def error_envelope(status: int, message: str | None = None, param: str | None = None) -> dict:
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


def json_response(payload: Any, status: int = 200, headers: Mapping | None = None) -> web.Response:
    return web.Response(
        body=orjson.dumps(payload), status=status, content_type="application/json", headers=headers
    )


# ---------------------------------------------------------------- server state


class SimulatorState:
    """What the server remembers: recorded calls and per-body counters.

    Touched by the server's event loop and read by tests from other threads,
    so every access holds the lock.
    """

    def __init__(self, config: SimulatorConfig):
        self.config = config
        self.request_count = 0
        self._lock = threading.Lock()
        self._recorded: deque = deque(maxlen=max(1, config.record_limit))
        self._seen: OrderedDict[bytes, int] = OrderedDict()

    def record(self, path: str, headers: Mapping, body: Any) -> None:
        """Count the call; keep it (secret headers left out) when recording."""
        with self._lock:
            self.request_count += 1
            if self.config.record:
                self._recorded.append({"path": path, "headers": recordable_headers(headers), "body": body})

    def requests(self, path: str | None = None) -> list[dict]:
        with self._lock:
            recorded = list(self._recorded)
        return [r for r in recorded if path is None or r["path"] == path]

    def times_seen(self, body_hash: bytes) -> int:
        """How many times this body was seen before; counts this time."""
        with self._lock:
            seen = self._seen.pop(body_hash, 0)
            self._seen[body_hash] = seen + 1
            if len(self._seen) > SEEN_BODIES_LIMIT:
                self._seen.popitem(last=False)
            return seen

    def reset(self) -> None:
        with self._lock:
            self._recorded.clear()
            self._seen.clear()
            self.request_count = 0


# ---------------------------------------------------------------- faults

ANSWER, FAIL, DROP, HANG = "answer", "fail", "drop", "hang"


def choose_outcome(
    config: SimulatorConfig, directives: FaultDirectives, seen: int, draw: float | None
) -> tuple[str, int | None]:
    """Decide the fate of one request: (ANSWER | FAIL | DROP | HANG, status)."""
    if config.drop_all:
        return DROP, None
    if config.fail_all_status:
        return FAIL, config.fail_all_status
    if directives.hang:
        return HANG, None
    if directives.drop and (directives.drop_times is None or seen < directives.drop_times):
        return DROP, None
    if directives.status and directives.status >= 400:
        if directives.status_times is None or seen < directives.status_times:
            return FAIL, directives.status
    if draw is not None:
        return _outcome_of_draw(config, draw)
    return ANSWER, None


def _outcome_of_draw(config: SimulatorConfig, draw: float) -> tuple[str, int | None]:
    # One draw, cut into exclusive slices: drop, hang, then each error status.
    edge = config.drop_rate
    if draw < edge:
        return DROP, None
    edge += config.hang_rate
    if draw < edge:
        return HANG, None
    for status, rate in sorted(config.error_rates.items()):
        edge += rate
        if draw < edge:
            return FAIL, status
    return ANSWER, None


def seeded_draw(seed: int, body_hash: bytes, seen: int) -> float:
    # Seeded by the body and its repeat count, not by arrival order, so a run
    # is reproducible under any concurrency.
    return random.Random(f"{seed}:{body_hash.hex()}:{seen}").random()


def failure_response(config: SimulatorConfig, status: int, model: Any = None) -> web.Response:
    headers = None
    if status == 429:
        retry_after = config.retry_after_s if config.retry_after_s is not None else 1
        headers = {
            "Retry-After": f"{retry_after:g}",
            "retry-after-ms": str(int(retry_after * 1000)),
        }
    message = f"The model `{model}` does not exist." if status == 404 and isinstance(model, str) else None
    return json_response(error_envelope(status, message), status=status, headers=headers)


# ---------------------------------------------------------------- capacity model

BLOCK_TOKENS = 16  # vLLM's default KV block size
BLOCK_CHARS = 4 * BLOCK_TOKENS


class Overloaded(Exception):
    """The queue is full: answered 503 at once."""

    def __init__(self, waiting: int):
        super().__init__(f"The server is overloaded: {waiting} requests are waiting.")


def capacity_per_second(
    config: SimulatorConfig, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0
) -> float:
    """The most requests a second of this shape the server finishes, all N slots busy.

    Each request holds a slot for
        prefill_ms_per_token * (prompt_tokens - cached_tokens)
        + completion_tokens * decode_ms_per_token * (1 + decode_contention * (N - 1) / N)
    milliseconds, so N slots finish N * 1000 / that many a second. Time spent
    queued does not count (nothing runs then) and neither does `latency_ms`,
    which the server waits before a request queues. Infinite without a
    capacity model (slots 0) or when a request costs no time.
    """
    if config.slots <= 0:
        return math.inf
    slot_ms = prefill_ms(config, prompt_tokens - cached_tokens) + completion_tokens * decode_ms_per_token(
        config, config.slots
    )
    return math.inf if slot_ms <= 0 else config.slots * 1000 / slot_ms


def prefill_ms(config: SimulatorConfig, uncached_tokens: int) -> float:
    return config.prefill_ms_per_token * max(0, uncached_tokens)


def decode_ms_per_token(config: SimulatorConfig, busy: int) -> float:
    """One output token's time with `busy` slots held (continuous batching slows each a little)."""
    return config.decode_ms_per_token * (1 + config.decode_contention * (busy - 1) / config.slots)


def chat_prefix_text(body: dict) -> str:
    """What the prefix cache sees of a chat: each message's role and text, in order."""
    return "".join(
        f"{m.get('role')}\n{message_text(m)}\n" for m in chat_messages(body) if isinstance(m, dict)
    )


def completion_prefix_text(body: dict) -> str:
    return "\n".join(
        p if isinstance(p, str) else ",".join(map(str, p)) for p in completion_prompts(body)
    )


def response_prefix_text(body: dict) -> str:
    instructions = body.get("instructions")
    text = f"instructions\n{instructions}\n" if isinstance(instructions, str) else ""
    return text + "".join(
        f"{item.get('role', 'user')}\n{message_text(item)}\n" for item in response_inputs(body)
    )


def prefix_blocks(text: str, max_blocks: int) -> list[int]:
    """Keys of the text's whole 64-character blocks, each chained over all before it.

    Like vLLM's block hashes: equal keys mean equal text up to and including
    that block. Python's hash() is enough (the cache lives in one process):
    32 blocks (a 2,000-character prompt) cost 10 µs.
    """
    keys, key = [], 0
    for start in range(0, min(len(text) // BLOCK_CHARS, max_blocks) * BLOCK_CHARS, BLOCK_CHARS):
        key = hash((key, text[start : start + BLOCK_CHARS]))
        keys.append(key)
    return keys


class PrefixCache:
    """Blocks of recently prefilled prompts, least recently used evicted first.

    Not locked: the capacity model holds its lock around every call.
    """

    def __init__(self, capacity_tokens: int):
        self.capacity_blocks = capacity_tokens // BLOCK_TOKENS
        self._blocks: OrderedDict[int, None] = OrderedDict()

    @property
    def used_tokens(self) -> int:
        return len(self._blocks) * BLOCK_TOKENS

    def cached_tokens(self, keys: Sequence[int]) -> int:
        """Tokens of the request's leading blocks found in the cache."""
        found = 0
        for key in keys:
            if key not in self._blocks:
                break
            found += 1
        return found * BLOCK_TOKENS

    def insert(self, keys: Sequence[int]) -> None:
        # Tail first, so the shared head of a prompt is the most recently
        # used and a request's tail is evicted before its head (as vLLM
        # frees a request's blocks).
        for key in reversed(keys):
            if key in self._blocks:
                self._blocks.move_to_end(key)
            else:
                self._blocks[key] = None
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)

    def clear(self) -> None:
        self._blocks.clear()


class CapacityModel:
    """N slots, a FIFO queue before them, a prefix cache, and the figures of all three.

    Requests run on the server's event loop; tests and /_sim/stats read the
    figures from any thread, so every change holds the lock (five uncontended
    rounds a request). A request costs at most two timers (prefill, decode)
    beyond a plain answer.
    """

    def __init__(self, config: SimulatorConfig):
        self.config = config
        self.prefix_cache = PrefixCache(config.prefix_cache_tokens)
        self.running = 0
        self.waiting = 0
        self._waiters: deque[asyncio.Future] = deque()
        self._lock = threading.Lock()
        self._clear_figures()

    async def serve(self, prompt_tokens: int, completion_tokens: int, keys: list[int] | None) -> int:
        """Hold a slot for the request's prefill and decode; return its cached tokens.

        `keys` are the prompt's block keys, None when the prefix cache does
        not look at this request. Raises Overloaded when the queue is full.
        """
        await self._take_slot()
        try:
            with self._lock:
                cached = self.prefix_cache.cached_tokens(keys or ())
            await _pause(prefill_ms(self.config, prompt_tokens - cached))
            with self._lock:
                self.prefix_cache.insert(keys or ())
                busy = self.running
            await _pause(completion_tokens * decode_ms_per_token(self.config, busy))
        finally:
            self._give_slot_back()
        self._count(prompt_tokens, cached, completion_tokens, queried=0 if keys is None else prompt_tokens)
        return cached

    def stats(self) -> dict:
        with self._lock:
            self._add_busy_time()
            return {
                "slots": self.config.slots,
                "queue_limit": self.config.queue_limit,
                "completed": self.completed,
                "rejected": self.rejected,
                "running": self.running,
                "waiting": self.waiting,
                "max_running": self.max_running,
                "max_waiting": self.max_waiting,
                "busy_slot_seconds": self.busy_slot_seconds,
                "prompt_tokens": self.prompt_tokens,
                "cached_tokens": self.cached_tokens,
                "completion_tokens": self.completion_tokens,
                "prefix_cache_queries": self.prefix_cache_queries,
                "prefix_cache_used_tokens": self.prefix_cache.used_tokens,
            }

    def reset(self) -> None:
        """Zero the figures and empty the prefix cache; requests in flight carry on."""
        with self._lock:
            self._clear_figures()
            self.prefix_cache.clear()

    def _clear_figures(self) -> None:
        self.completed = self.rejected = 0
        self.prompt_tokens = self.cached_tokens = self.completion_tokens = 0
        self.prefix_cache_queries = 0
        self.max_running, self.max_waiting = self.running, self.waiting
        self.busy_slot_seconds = 0.0
        self._busy_since = time.monotonic()

    async def _take_slot(self) -> None:
        with self._lock:
            # While a slot is free nobody waits (a freed slot goes straight
            # to the first live waiter), so taking it keeps the queue FIFO.
            if self.running < self.config.slots:
                self._set_running(self.running + 1)
                return
            limit = self.config.queue_limit
            if limit is not None and self.waiting >= limit:
                self.rejected += 1
                raise Overloaded(self.waiting)
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            self.waiting += 1
            self.max_waiting = max(self.max_waiting, self.waiting)
        try:
            await waiter
        except asyncio.CancelledError:
            self._leave_queue(waiter)
            raise

    def _leave_queue(self, waiter: asyncio.Future) -> None:
        if waiter.done() and not waiter.cancelled():
            # Handed a slot just as the caller went away: pass it on.
            self._give_slot_back()
            return
        with self._lock:
            self.waiting -= 1
            try:
                self._waiters.remove(waiter)
            except ValueError:  # already skipped by _give_slot_back
                pass

    def _give_slot_back(self) -> None:
        with self._lock:
            while self._waiters:
                waiter = self._waiters.popleft()
                if not waiter.done():  # a cancelled waiter counts itself out
                    waiter.set_result(None)
                    self.waiting -= 1
                    return
            self._set_running(self.running - 1)

    def _set_running(self, running: int) -> None:
        self._add_busy_time()
        self.running = running
        self.max_running = max(self.max_running, running)

    def _add_busy_time(self) -> None:
        now = time.monotonic()
        self.busy_slot_seconds += self.running * (now - self._busy_since)
        self._busy_since = now

    def _count(self, prompt_tokens: int, cached: int, completion_tokens: int, queried: int) -> None:
        with self._lock:
            self.completed += 1
            self.prompt_tokens += prompt_tokens
            self.cached_tokens += cached
            self.completion_tokens += completion_tokens
            self.prefix_cache_queries += queried


async def _pause(milliseconds: float) -> None:
    if milliseconds > 0:
        await asyncio.sleep(milliseconds / 1000)


def usage_counts(payload: dict) -> tuple[int | None, int]:
    """(prompt, completion) tokens of an answer's usage; (None, 0) without usage."""
    usage = payload.get("usage")
    if not isinstance(usage, dict):
        return None, 0
    if "input_tokens" in usage:
        return usage["input_tokens"], usage["output_tokens"]
    return usage["prompt_tokens"], usage.get("completion_tokens", 0)


def report_cached_tokens(payload: dict, cached: int) -> None:
    usage = payload.get("usage") or {}
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details")
    if details is not None:
        details["cached_tokens"] = cached


# ---------------------------------------------------------------- metrics

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def render_metrics(config: SimulatorConfig, stats: dict) -> str:
    """Prometheus text with vLLM's or llama.cpp's metric names and types, from the live figures.

    KV-cache usage is busy slots / slots (the simulator keeps no KV blocks).
    """
    usage = stats["running"] / config.slots if config.slots else 0.0
    if config.metrics == "llamacpp":
        # llama-server's prompt counter counts the tokens it processed, so
        # cached ones are left out; its lines carry no labels.
        return "".join([
            _metric("llamacpp:prompt_tokens_total", "counter", "Prompt tokens processed (uncached).",
                    stats["prompt_tokens"] - stats["cached_tokens"]),
            _metric("llamacpp:tokens_predicted_total", "counter", "Tokens generated.", stats["completion_tokens"]),
            _metric("llamacpp:kv_cache_usage_ratio", "gauge", "Busy slots / slots (0 to 1).", usage),
            _metric("llamacpp:requests_processing", "gauge", "Requests holding a slot.", stats["running"]),
            _metric("llamacpp:requests_deferred", "gauge", "Requests waiting for a slot.", stats["waiting"]),
        ])
    # vLLM writes through prometheus_client: float values, model_name and engine labels.
    model = (config.models[0] if config.models else "").replace("\\", "\\\\").replace('"', '\\"')
    labels = f'{{engine="0",model_name="{model}"}}'
    gauges = [
        ("vllm:num_requests_running", "Requests holding a slot.", stats["running"]),
        ("vllm:num_requests_waiting", "Requests waiting for a slot.", stats["waiting"]),
        ("vllm:kv_cache_usage_perc", "Busy slots / slots (0 to 1).", usage),
        ("vllm:gpu_cache_usage_perc", "The older name of vllm:kv_cache_usage_perc.", usage),
    ]
    counters = [
        ("vllm:prompt_tokens_total", "Prompt tokens, cached or not.", stats["prompt_tokens"]),
        ("vllm:generation_tokens_total", "Tokens generated.", stats["completion_tokens"]),
        ("vllm:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
         stats["prefix_cache_queries"]),
        ("vllm:prefix_cache_hits_total", "Prompt tokens found in the prefix cache.", stats["cached_tokens"]),
    ]
    return "".join(
        [_metric(name, "gauge", text, float(value), labels) for name, text, value in gauges]
        + [_metric(name, "counter", text, float(value), labels) for name, text, value in counters]
    )


def _metric(name: str, kind: str, help_text: str, value: float, labels: str = "") -> str:
    return f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n{name}{labels} {value}\n"


# ---------------------------------------------------------------- the server


@dataclass(frozen=True)
class ModelEndpoint:
    text_of: Any  # body -> the text searched for fault directives
    answer: Any  # body -> answer payload (raises BadRequest)
    prefix_of: Any = None  # body -> the text the prefix cache sees (None: no cache)


MODEL_ENDPOINTS = {
    "/v1/chat/completions": ModelEndpoint(chat_text, answer_chat, chat_prefix_text),
    "/v1/completions": ModelEndpoint(completion_text, answer_completion, completion_prefix_text),
    "/v1/embeddings": ModelEndpoint(embedding_text, answer_embeddings),
    "/v1/responses": ModelEndpoint(response_text, answer_responses, response_prefix_text),
    "/v1/moderations": ModelEndpoint(moderation_text, answer_moderations),
}


class ModelServer:
    """The request handlers, bound to one config and one state."""

    def __init__(self, config: SimulatorConfig):
        self.config = config
        self.state = SimulatorState(config)
        self.capacity = CapacityModel(config)
        self._parked: set[asyncio.Task] = set()

    async def model_call(self, request: web.Request) -> web.StreamResponse:
        endpoint = MODEL_ENDPOINTS[request.path]
        raw = await request.read()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = None
        # An unparsable body is recorded as text: tests want to see what came.
        recorded = body if body is not None else raw.decode(errors="replace")
        self.state.record(request.path, request.headers, recorded)
        if not self._authorized(request):
            return json_response(error_envelope(401, "Invalid API key."), 401)
        if not isinstance(body, dict):
            return json_response(error_envelope(400, "The body must be a JSON object."), 400)
        text = endpoint.text_of(body)
        directives = parse_fault_directives(text)
        outcome, status = self._decide(directives, raw)
        delay_ms = self.config.latency_ms + directives.latency_ms
        if delay_ms > 0 and outcome != HANG:
            await self._park(delay_ms / 1000)
        if outcome == ANSWER and self.config.slots:
            return await self._answer_in_a_slot(endpoint, body, text)
        if outcome == ANSWER:
            return self._answer(endpoint, body)
        if outcome == FAIL:
            return failure_response(self.config, status, body.get("model"))
        if outcome == DROP:
            return await self._drop(request)
        return await self._hang()

    def _decide(self, directives: FaultDirectives, raw: bytes) -> tuple[str, int | None]:
        seen, draw = 0, None
        if directives.counts_repeats or self.config.draws_at_random:
            body_hash = hashlib.blake2b(raw, digest_size=16).digest()
            seen = self.state.times_seen(body_hash)
            if self.config.draws_at_random:
                draw = seeded_draw(self.config.seed, body_hash, seen)
        return choose_outcome(self.config, directives, seen, draw)

    def _answer(self, endpoint: ModelEndpoint, body: dict) -> web.Response:
        try:
            return json_response(endpoint.answer(body))
        except BadRequest as exc:
            return json_response(error_envelope(400, str(exc), exc.param), 400)

    async def _answer_in_a_slot(self, endpoint: ModelEndpoint, body: dict, text: str) -> web.Response:
        # The answer is known before the slot (a 400 never queues); the slot
        # only decides when it goes out and how much of the prompt was cached.
        try:
            payload = endpoint.answer(body)
        except BadRequest as exc:
            return json_response(error_envelope(400, str(exc), exc.param), 400)
        prompt_tokens, completion_tokens = usage_counts(payload)
        if prompt_tokens is None:  # moderations carry no usage
            prompt_tokens = count_tokens(text)
        keys = None
        if self.config.prefix_cache_tokens and endpoint.prefix_of is not None:
            keys = prefix_blocks(endpoint.prefix_of(body), prompt_tokens // BLOCK_TOKENS)
        try:
            with self._parking():
                cached = await self.capacity.serve(prompt_tokens, completion_tokens, keys)
        except Overloaded as exc:
            # Retry-After, as an overloaded server says when to come back (RFC 9110, 503).
            retry_after = self.config.retry_after_s if self.config.retry_after_s is not None else 1
            headers = {"Retry-After": f"{retry_after:g}"}
            return json_response(error_envelope(503, str(exc)), 503, headers=headers)
        report_cached_tokens(payload, cached)
        return json_response(payload)

    async def _drop(self, request: web.Request) -> web.StreamResponse:
        # abort() rather than close(): no graceful shutdown, the client sees
        # the connection end without a response, like a crashed upstream.
        if request.transport is not None:
            request.transport.abort()
        raise asyncio.CancelledError  # ends the handler without writing anything

    async def _hang(self) -> web.StreamResponse:
        await self._park(None)
        raise AssertionError("unreachable: parking forever only ends by cancellation")

    async def _park(self, seconds: float | None) -> None:
        """Sleep (forever when seconds is None) where shutdown can cut it short."""
        with self._parking():
            if seconds is None:
                await asyncio.get_running_loop().create_future()
            else:
                await asyncio.sleep(seconds)

    @contextlib.contextmanager
    def _parking(self):
        """Let wake_parked cancel this task while it waits inside the block."""
        task = asyncio.current_task()
        self._parked.add(task)
        try:
            yield
        finally:
            self._parked.discard(task)

    async def wake_parked(self, app: web.Application | None = None) -> None:
        # Hung, sleeping, queued and slot-holding handlers would otherwise
        # hold shutdown for the whole shutdown timeout.
        for task in list(self._parked):
            task.cancel()

    def _authorized(self, request: web.Request) -> bool:
        return not self.config.api_key or request.headers.get("Authorization") == f"Bearer {self.config.api_key}"

    async def list_models(self, request: web.Request) -> web.StreamResponse:
        if not self._authorized(request):
            return json_response(error_envelope(401, "Invalid API key."), 401)
        if self.config.drop_all:
            return await self._drop(request)
        if self.config.fail_all_status:
            return failure_response(self.config, self.config.fail_all_status)
        data = [
            {"id": name, "object": "model", "created": MODELS_CREATED, "owned_by": "openrelay-sim"}
            for name in self.config.models
        ]
        return json_response({"object": "list", "data": data})

    async def recorded_requests(self, request: web.Request) -> web.Response:
        return json_response(self.state.requests(request.query.get("path")))

    async def reset(self, request: web.Request) -> web.Response:
        self.forget()
        return json_response({"reset": True})

    def forget(self) -> None:
        """Recorded calls, per-body counters, capacity figures and prefix cache."""
        self.state.reset()
        self.capacity.reset()

    async def stats(self, request: web.Request) -> web.Response:
        return json_response(self.capacity.stats())

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        # llama-server asks for its API key on /metrics; vLLM's key guards /v1 only.
        if self.config.metrics == "llamacpp" and not self._authorized(request):
            return json_response(error_envelope(401, "Invalid API key."), 401)
        if self.config.drop_all:
            return await self._drop(request)
        if self.config.fail_all_status:
            return failure_response(self.config, self.config.fail_all_status)
        text = render_metrics(self.config, self.capacity.stats())
        return web.Response(body=text.encode(), headers={"Content-Type": PROMETHEUS_CONTENT_TYPE})

    async def not_found(self, request: web.Request) -> web.Response:
        message = f"Invalid URL ({request.method} {request.path})"
        return json_response(error_envelope(404, message), 404)


def recordable_headers(headers: Mapping) -> dict:
    return {k.lower(): v for k, v in headers.items() if k.lower() not in SECRET_HEADERS}


SERVER_KEY = web.AppKey("model_server", ModelServer)


def build_app(config: SimulatorConfig | None = None) -> web.Application:
    """The aiohttp application; `app[SERVER_KEY].state` holds the recordings."""
    server = ModelServer(config or SimulatorConfig())
    # Request bodies (embedding inputs, long chats) can exceed aiohttp's 1 MB default.
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[SERVER_KEY] = server
    for path in MODEL_ENDPOINTS:
        app.router.add_post(path, server.model_call)
    app.router.add_get("/v1/models", server.list_models)
    app.router.add_get("/_sim/requests", server.recorded_requests)
    app.router.add_post("/_sim/reset", server.reset)
    app.router.add_get("/_sim/stats", server.stats)
    if server.config.metrics:
        app.router.add_get("/metrics", server.metrics)
    app.router.add_route("*", "/{tail:.*}", server.not_found)
    app.on_shutdown.append(server.wake_parked)
    return app


def make_runner(app: web.Application) -> web.AppRunner:
    # No access log (it halves throughput); cancel handlers whose client went
    # away so hung requests do not pile up; a short shutdown never waits long.
    return web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0)


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


# ---------------------------------------------------------------- in a thread


class AppThread:
    """Any aiohttp application on its own event loop in a background thread.

    Tests use it for their peers (the simulator, tool executors, workflow
    callbacks). A context manager, or start() and stop() (pytest fixtures).
    """

    def __init__(self, app: web.Application, host: str = "127.0.0.1", port: int = 0, name: str = "aiohttp"):
        self.app = app
        self.host = host
        self.name = name
        self._requested_port = port
        self.port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self):
        if self._thread is not None:
            return self
        sock = bind_socket(self.host, self._requested_port)
        self.port = sock.getsockname()[1]
        # Daemon: a test that forgets stop() must not keep the interpreter alive.
        self._thread = threading.Thread(
            target=self._run, args=(sock,), name=f"{self.name}:{self.port}", daemon=True
        )
        self._thread.start()
        self._ready.wait()
        if self._startup_error is not None:
            raise RuntimeError(f"{self.name} server failed to start") from self._startup_error
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        if self._loop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._thread = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def _run(self, sock: socket.socket) -> None:
        loop = self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        runner = make_runner(self.app)
        try:
            loop.run_until_complete(_start_site(runner, sock))
        except BaseException as exc:  # noqa: BLE001 - reported to start() in the caller's thread
            self._startup_error = exc
            self._ready.set()
            sock.close()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(runner.cleanup())
            _cancel_leftover_tasks(loop)
            loop.close()


class SimulatorThread(AppThread):
    """A simulator in a background thread (for tests)."""

    def __init__(
        self, config: SimulatorConfig | None = None, host: str = "127.0.0.1", port: int = 0
    ):
        self.config = config or SimulatorConfig()
        super().__init__(build_app(self.config), host, port, name="simulator")
        self.state = self.app[SERVER_KEY].state

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def requests(self, path: str | None = None) -> list[dict]:
        """Recorded calls `{"path", "headers", "body"}`, oldest first."""
        return self.state.requests(path)

    def bodies(self, path: str | None = None) -> list[Any]:
        return [r["body"] for r in self.state.requests(path)]

    @property
    def request_count(self) -> int:
        """Model calls since start or reset (counted even when not recorded)."""
        return self.state.request_count

    def reset(self) -> None:
        self.app[SERVER_KEY].forget()

    def stats(self) -> dict:
        """The capacity model's figures, as `GET /_sim/stats` answers."""
        return self.app[SERVER_KEY].capacity.stats()


def run_in_thread(
    config: SimulatorConfig | None = None, *, host: str = "127.0.0.1", port: int = 0
) -> SimulatorThread:
    """A simulator for tests: `with run_in_thread(cfg) as sim:` or `.start()`."""
    return SimulatorThread(config, host, port)


async def _start_site(runner: web.AppRunner, sock: socket.socket) -> None:
    await runner.setup()
    await web.SockSite(runner, sock).start()


def _cancel_leftover_tasks(loop: asyncio.AbstractEventLoop) -> None:
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())


# ---------------------------------------------------------------- blocking serve


def serve(
    config: SimulatorConfig | None = None, host: str = "127.0.0.1", port: int = 8001
) -> None:
    """Run until SIGINT/SIGTERM; prints where it listens."""
    try:
        aio.run(_serve_until_signal(config or SimulatorConfig(), host, port))
    except KeyboardInterrupt:
        pass


async def _serve_until_signal(config: SimulatorConfig, host: str, port: int) -> None:
    runner = make_runner(build_app(config))
    sock = bind_socket(host, port)
    await _start_site(runner, sock)
    print(f"Simulated model server on http://{host}:{sock.getsockname()[1]}/v1", flush=True)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(signum, stopping.set)
        except (NotImplementedError, RuntimeError):  # not the main thread, or Windows
            pass
    try:
        await stopping.wait()
    finally:
        await runner.cleanup()


# ---------------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags shared by `python -m openrelay.simulator` and `manage.py simulate_model`."""
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001, help="0 picks a free port")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="added to every answer")
    parser.add_argument(
        "--error-rate", action="append", type=parse_error_rates, default=[], metavar="STATUS=P",
        help="e.g. 503=0.1 (repeat the flag, or 503=0.1,429=0.05)",
    )
    parser.add_argument("--drop-rate", type=float, default=0.0)
    parser.add_argument("--hang-rate", type=float, default=0.0)
    parser.add_argument("--retry-after", type=float, default=None, help="seconds, sent with 429s")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--fail-all-status", type=int, default=None, help="answer every request with this status"
    )
    parser.add_argument("--drop-all", action="store_true", help="drop every connection")
    parser.add_argument("--no-record", action="store_true", help="do not record requests")
    parser.add_argument("--record-limit", type=int, default=10_000)
    parser.add_argument(
        "--model", action="append", default=[], help="listed by /v1/models (repeatable)"
    )
    capacity = parser.add_argument_group("capacity model (off while --slots is 0)")
    capacity.add_argument("--slots", type=int, default=0, help="requests decoded at once")
    capacity.add_argument(
        "--queue-limit", type=int, default=None,
        help="waiting requests past which a new one gets 503 (default: no limit)",
    )
    capacity.add_argument("--prefill-ms-per-token", type=float, default=0.0, help="per uncached prompt token")
    capacity.add_argument("--decode-ms-per-token", type=float, default=0.0, help="per output token, one slot busy")
    capacity.add_argument(
        "--decode-contention", type=float, default=0.0,
        help="a token takes (1 + C * (busy - 1) / slots) times as long",
    )
    capacity.add_argument("--prefix-cache-tokens", type=int, default=0, help="prefix cache size (LRU)")
    capacity.add_argument(
        "--metrics", choices=METRICS_STYLES[1:], default="", help="serve GET /metrics in this server's style"
    )


def parse_error_rates(text: str) -> dict[int, float]:
    rates = {}
    for pair in text.split(","):
        status, sep, rate = pair.partition("=")
        try:
            rates[int(status)] = float(rate)
        except ValueError:
            message = f"expected STATUS=PROBABILITY, got {pair!r}"
            raise argparse.ArgumentTypeError(message) from None
    return rates


def config_from_options(options: Mapping[str, Any]) -> SimulatorConfig:
    error_rates: dict[int, float] = {}
    for rates in options.get("error_rate") or ():
        error_rates.update(rates)
    return SimulatorConfig(
        latency_ms=options.get("latency_ms") or 0.0,
        error_rates=error_rates,
        drop_rate=options.get("drop_rate") or 0.0,
        hang_rate=options.get("hang_rate") or 0.0,
        retry_after_s=options.get("retry_after"),
        seed=options.get("seed") or 0,
        fail_all_status=options.get("fail_all_status"),
        drop_all=bool(options.get("drop_all")),
        record=not options.get("no_record"),
        record_limit=options.get("record_limit") or 10_000,
        models=tuple(options.get("model") or DEFAULT_MODELS),
        slots=options.get("slots") or 0,
        queue_limit=options.get("queue_limit"),
        prefill_ms_per_token=options.get("prefill_ms_per_token") or 0.0,
        decode_ms_per_token=options.get("decode_ms_per_token") or 0.0,
        decode_contention=options.get("decode_contention") or 0.0,
        prefix_cache_tokens=options.get("prefix_cache_tokens") or 0,
        metrics=options.get("metrics") or "",
    )


def main(argv: Iterable[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m openrelay.simulator",
        description="Simulated OpenAI-compatible model server.",
    )
    add_arguments(parser)
    options = vars(parser.parse_args(argv))
    try:
        config = config_from_options(options)
    except ValueError as exc:
        parser.error(str(exc))
    serve(config, options["host"], options["port"])


if __name__ == "__main__":
    main(sys.argv[1:])
