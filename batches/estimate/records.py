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

from batches import endpoints

# Records the tokenizer counts at most in one quote: all of them up to this, a sample past it.
# 200 calls to a local tokenizer take ~0.2 s; the ratio of exact to local counts varies little
# between records, so 200 put the total within ~1% (tests/perf/bench_estimate.py measures it).
SAMPLE_SIZE = 200
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
    _next_kept: int = 0  # the record count at which the reservoir next takes one (Algorithm L)
    _weight: float = 1.0

    def observe(self, obj, line):
        body = obj["body"]
        chars = input_length(self.endpoint, body)
        self.records += 1
        self.chars += chars
        self.approx_tokens += approximate_tokens(chars)
        self.caps[output_cap(self.endpoint, body)] += 1
        extensions = body.get("openrelay")
        if extensions is not None and isinstance(extensions, dict) and extensions.get("tool_config") is not None:
            self.tool_records += 1
        if len(self.sample) < SAMPLE_SIZE:
            self.sample.append(Sampled(line, chars))
            if len(self.sample) == SAMPLE_SIZE:
                self._skip()
        elif self.records == self._next_kept:
            self.sample[self.rng.randrange(SAMPLE_SIZE)] = Sampled(line, chars)
            self._skip()

    def _skip(self):
        """Reservoir sampling by Li's Algorithm L: every record has the same chance to be in the
        sample, and only the records taken cost a random draw (Algorithm R drew one a record:
        0.4 s of a 50,000-record quote)."""
        self._weight *= math.exp(math.log(self.rng.random()) / SAMPLE_SIZE)
        self._next_kept = self.records + math.floor(math.log(self.rng.random()) / math.log(1 - self._weight)) + 1

    def load_bodies(self, read_records):
        """Read the sampled records' bodies (read_records: {line: record} for lines)."""
        records = read_records([sampled.line for sampled in self.sample])
        for sampled in self.sample:
            sampled.body = records[sampled.line]["body"]

    @property
    def sampled(self):
        return self.records > len(self.sample)


def output_cap(endpoint, body):
    for key in endpoints.get(endpoint).cap_keys:
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value * _choices(body)
    return None


def _choices(body):
    n = body.get("n")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1


def input_length(endpoint, body):
    """The characters of a record's input text (messages, prompt or input), as a local count reads it.

    Lengths are summed, not the text joined: the quote reads every record of the file."""
    quote = endpoints.get(endpoint).quote
    if quote == "chat":
        messages = _listed(body.get("messages"))
        length = len(messages) - 1 if messages else 0  # the newlines between them
        for message in messages:
            length += _message_length(message)
        return length
    if quote == "responses":
        return len(input_text(endpoint, body))
    value = _text_input(endpoint, body)
    if isinstance(value, str):
        return len(value)
    items = _listed(value)
    return sum(len(item) if isinstance(item, str) else len(_content_text([item])) for item in items) + max(
        0, len(items) - 1
    )


def input_text(endpoint, body):
    """The text of a record's input, as a local count reads it (messages, prompt or input)."""
    quote = endpoints.get(endpoint).quote
    if quote == "chat":
        return "\n".join(_message_text(m) for m in _listed(body.get("messages")))
    if quote == "responses":
        instructions = body.get("instructions") if isinstance(body.get("instructions"), str) else ""
        value = body.get("input")
        items = [{"content": value}] if isinstance(value, str) else _listed(value)
        return "\n".join([instructions, *(_message_text(item) for item in items)]).strip("\n")
    value = _text_input(endpoint, body)
    if isinstance(value, str):
        return value
    return "\n".join(item if isinstance(item, str) else _content_text([item]) for item in _listed(value))


def _text_input(endpoint, body):
    """The prompt or input (a string or a list) of a record whose quote reads it as text; None for none."""
    spec = endpoints.get(endpoint)
    return body.get(spec.input_key) if spec.quote == "text" else None


def _listed(value):
    return value if isinstance(value, list) else []


def _content_text(content):
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str))
    return ""


def _message_length(message):
    if type(message) is not dict:
        return 0
    content = message.get("content")
    length = len(content) if type(content) is str else len(_content_text(content))
    calls = message.get("tool_calls")
    return length + len(_message_text({"tool_calls": calls})) if calls else length


def _message_text(message):
    if not isinstance(message, dict):
        return ""
    text = _content_text(message.get("content"))
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            text += str(function.get("name") or "") + str(function.get("arguments") or "")
    return text
