"""The `[[...]]` directives in a request's text.

Faults (`status`, `drop`, `hang`, `latency`), tool behaviour (`tool_rounds`,
`tool_calls`, `tool_args`) and the answer's size (`tokens`); JSON answers'
directives (`answer_json`, `invalid_output`) are read in structured.py. Parsing them,
padding or cutting an answer to `[[tokens:N]]`, and removing them from the
text an answer echoes. Pure text functions: they import nothing else of the
package.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

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
    r"\[\[(?:status|drop|hang|latency|tool_rounds|tool_calls|tool_args|tokens|invalid_output|answer_json)\b.*?\]\]",
    re.S,
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
    arguments: dict[str, Any] | None = None


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


def _literal_tool_arguments(text: str) -> dict[str, Any] | None:
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
