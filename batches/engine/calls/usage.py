"""What a model server says an answer used, read from whichever shape the endpoint answers in.

Anthropic Messages report `input_tokens` (without the prompt cache's part),
`cache_read_input_tokens`, `cache_creation_input_tokens` and `output_tokens`.
Chat completions, completions and embeddings report `prompt_tokens` /
`completion_tokens` (with `prompt_tokens_details.cached_tokens` and
`completion_tokens_details.reasoning_tokens`); the Responses API reports
`input_tokens` / `output_tokens` (with `input_tokens_details.cached_tokens`
and `output_tokens_details.reasoning_tokens`); moderations report nothing.

We bill what the server reports, even when it cannot be right (llama.cpp
answered `n: 2` with one choice's tokens), and count such answers instead:
`Usage.implausible` is how many of the answers summed into a Usage reported
usage that cannot be right, so a batch can show operators how many records
to doubt.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    implausible: int = 0  # answers among those summed here whose reported usage cannot be right

    @classmethod
    def from_body(cls, body):
        """The usage a 2xx answer reports, marked implausible when it cannot be right."""
        if _is_moderation(body):
            return cls()  # moderations report no usage, and none is billed
        usage = body.get("usage") if isinstance(body, dict) else None
        if not isinstance(usage, dict):
            return cls(implausible=1)  # a 200 that reports nothing at all
        if body.get("type") == "message":
            read = _read_anthropic
        elif "input_tokens" in usage or "output_tokens" in usage:
            read = _read_responses
        else:
            read = _read_chat
        found = read(usage)
        return found if not _implausible(body, found) else cls(*_counts(found), implausible=1)

    def __add__(self, other):
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.cached_tokens + other.cached_tokens,
            self.completion_tokens + other.completion_tokens,
            self.reasoning_tokens + other.reasoning_tokens,
            self.implausible + other.implausible,
        )

    @property
    def total_tokens(self):
        return self.prompt_tokens + self.completion_tokens

    def as_openai(self):
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
        }


def _int(value):
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _detail(usage, details, name):
    found = usage.get(details)
    return _int(found.get(name)) if isinstance(found, dict) else 0


def _read_chat(usage):
    return Usage(
        _int(usage.get("prompt_tokens")),
        _detail(usage, "prompt_tokens_details", "cached_tokens"),
        _int(usage.get("completion_tokens")),
        _detail(usage, "completion_tokens_details", "reasoning_tokens"),
    )


def _read_responses(usage):
    return Usage(
        _int(usage.get("input_tokens")),
        _detail(usage, "input_tokens_details", "cached_tokens"),
        _int(usage.get("output_tokens")),
        _detail(usage, "output_tokens_details", "reasoning_tokens"),
    )


def _read_anthropic(usage):
    """A Message's usage: its input_tokens leave out what was read from or written to the prompt
    cache, so the prompt is all three; cache reads are the cached part (cache writes bill as input)."""
    cache_read = _int(usage.get("cache_read_input_tokens"))
    prompt = _int(usage.get("input_tokens")) + cache_read + _int(usage.get("cache_creation_input_tokens"))
    return Usage(prompt, cache_read, _int(usage.get("output_tokens")), 0)


def _counts(usage):
    return usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens, usage.reasoning_tokens


def _is_moderation(body):
    return isinstance(body, dict) and isinstance(body.get("results"), list) and "usage" not in body


def _implausible(body, usage):
    """Usage no real model could have used: no input, parts larger than their whole, or fewer
    generated tokens than the answers generated (every choice or output item costs at least one)."""
    if usage.prompt_tokens == 0 or usage.cached_tokens > usage.prompt_tokens:
        return True
    if usage.reasoning_tokens > usage.completion_tokens:
        return True
    generated = _generated_parts(body)
    return generated is not None and usage.completion_tokens < generated


def _generated_parts(body):
    """How many separately generated answers the body holds (None: it generates nothing, e.g. embeddings)."""
    if body.get("object") == "response":
        output = body.get("output")
        return len(output) if isinstance(output, list) else 0
    choices = body.get("choices")
    return len(choices) if isinstance(choices, list) else None
