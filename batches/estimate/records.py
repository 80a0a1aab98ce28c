"""What a quote keeps of each accepted record while create's scan reads it: a few counters and a sample.

Nothing grows with the input but the caps' histogram (one entry a distinct
max_tokens value): 50,000 records hold as little memory as create's scan.
The sample (reservoir sampling, seeded so a quote repeats: line numbers, the
bodies read again after the scan) is what the tokenizer counts exactly; every record's local count scales it to the whole.
"""

import math
import random
from collections import Counter
from dataclasses import dataclass, field

# Records the tokenizer counts at most in one quote: all of them up to this, a sample past it.
# 200 calls to a local tokenizer take ~0.2 s; the ratio of exact to local counts varies little
# between records, so 200 put the total within ~1% (tests/perf/bench_estimate.py measures it).
SAMPLE_SIZE = 200
# Output caps, by endpoint: the body keys that bound a record's output tokens, first found wins.
CAP_KEYS = {
    "/v1/chat/completions": ("max_completion_tokens", "max_tokens"),
    "/v1/completions": ("max_tokens",),
    "/v1/responses": ("max_output_tokens",),
}
# Endpoints that answer no output tokens.
NO_OUTPUT = ("/v1/embeddings", "/v1/moderations")
CHARS_PER_TOKEN = 4  # the approximation's rule (OpenAI's rule of thumb for English text)


def approximate_tokens(chars):
    return max(1, math.ceil(chars / CHARS_PER_TOKEN))


@dataclass
class Sampled:
    line: int
    chars: int
    body: dict | None = None  # read again after the scan (load_bodies): 200 bodies of up to 10 MB are not kept


@dataclass
class RecordTally:
    """The accepted records as the quote needs them: counts, caps, and a sample of bodies."""

    endpoint: str
    records: int = 0
    chars: int = 0  # the input text's characters, over every record
    approx_tokens: int = 0  # the approximation, record by record
    tool_records: int = 0
    caps: Counter = field(default_factory=Counter)  # max output tokens -> records (None: uncapped)
    sample: list = field(default_factory=list)
    rng: random.Random = field(default_factory=lambda: random.Random(41))

    def observe(self, obj, line):
        body = obj["body"]
        chars = len(input_text(self.endpoint, body))
        self.records += 1
        self.chars += chars
        self.approx_tokens += approximate_tokens(chars)
        self.caps[output_cap(self.endpoint, body)] += 1
        if isinstance(body.get("openrelay"), dict) and body["openrelay"].get("tool_config") is not None:
            self.tool_records += 1
        self._keep(line, chars)

    def _keep(self, line, chars):
        # Reservoir sampling (Algorithm R): every record has the same chance to be in the sample.
        if len(self.sample) < SAMPLE_SIZE:
            self.sample.append(Sampled(line, chars))
            return
        slot = self.rng.randrange(self.records)
        if slot < SAMPLE_SIZE:
            self.sample[slot] = Sampled(line, chars)

    def load_bodies(self, read_records):
        """Read the sampled records' bodies (read_records: {line: record} for lines)."""
        records = read_records([sampled.line for sampled in self.sample])
        for sampled in self.sample:
            sampled.body = records[sampled.line]["body"]

    @property
    def sampled(self):
        return self.records > len(self.sample)


def output_cap(endpoint, body):
    for key in CAP_KEYS.get(endpoint, ()):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value * _choices(body)
    return None


def _choices(body):
    n = body.get("n")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1


def input_text(endpoint, body):
    """The text of a record's input, as a local count reads it (messages, prompt or input)."""
    if endpoint == "/v1/chat/completions":
        return "\n".join(_message_text(m) for m in _listed(body.get("messages")))
    if endpoint == "/v1/responses":
        instructions = body.get("instructions") if isinstance(body.get("instructions"), str) else ""
        value = body.get("input")
        items = [{"content": value}] if isinstance(value, str) else _listed(value)
        return "\n".join([instructions, *(_message_text(item) for item in items)]).strip("\n")
    value = body.get("prompt") if endpoint == "/v1/completions" else body.get("input")
    if isinstance(value, str):
        return value
    return "\n".join(item if isinstance(item, str) else _content_text([item]) for item in _listed(value))


def _listed(value):
    return value if isinstance(value, list) else []


def _content_text(content):
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str))
    return ""


def _message_text(message):
    if not isinstance(message, dict):
        return ""
    text = _content_text(message.get("content"))
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            text += str(function.get("name") or "") + str(function.get("arguments") or "")
    return text
