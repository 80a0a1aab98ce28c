"""Big answers kept as the server's JSON text: never parsed into Python objects.

A plain record's big answer (an embeddings answer of 2,048 x 3,072 floats is ~134 MB) is only
read for its usage, renamed (its `model`) and stored. Parsed, it cost the worker 1.6x its bytes
in Python objects held to its flush, its JSON text was made again there (bytes, then str) and the
driver copied that str once more (issue 55, item 6: one 35 MB answer peaked at 14.7x its bytes,
traced, parse buffers included; 16 of 134 MB took a worker to 3.42 GB). Kept as text, the answer
is its received bytes until the flush sends them as they are.

`read` walks the text's strings with bytes.find (C speed) and counts brackets between them, so
it finds the top-level fields without building the big ones, and parses only the small ones
(`head`: usage, model, object...). It checks the shape: the text is ASCII without control
characters (so one line of a JSONL result file), its strings end, its brackets balance, it is one
object of "key": value fields, and what lies between strings is only JSON's number, literal and
punctuation characters. The big fields' tokens are checked too (`_tokens_valid`), so a server's
`1.2.3`, `-` or `tru` never reaches a result file as a line no JSON reader takes; the small fields
are parsed whole. Anything else (non-ASCII, whitespace other than spaces, a big `choices`, too
many strings to walk quickly, a token JSON does not allow) returns None: the caller parses the
answer as before, and a body that is not JSON is the call's error.
"""

from __future__ import annotations

import contextvars

import orjson

BIG_BYTES = 1024 * 1024  # answers over this may be kept as text (budget.SMALL_BYTES, the same line)
SMALL_FIELD = 64 * 1024  # a top-level field up to this is parsed into `head`
MAX_STRINGS = 200_000  # a text with more strings is parsed instead (walking them costs ~1 us each)
# Fields the engine reads (usage, the implausible-usage rules, moderations): when one is big, parse.
READ_FIELDS = ("usage", "model", "object", "type", "choices", "output", "results")

# Whether the running record's calls may hand back AnswerText (loops.plain sets it: a loop that
# reads its answers, a tool loop's or a contract's, gets them parsed).
wanted: contextvars.ContextVar[bool] = contextvars.ContextVar("answer_text_wanted", default=False)

_VISIBLE_ASCII = bytes(range(0x20, 0x7F))
# What JSON holds outside its strings: numbers and their separators (dropped first, in one pass:
# what is left is short), then brackets and the letters of true, false and null.
_NUMBERS = b"0123456789+-.eE,: "
_BRACKETS_AND_LITERALS = b"[]{}truefalsn"
# The tokens of a big field are checked by orjson in runs of this many bytes, cut at commas: one run's
# floats (~50,000, ~2 MB) at a time, where parsing the field whole held 1.6x its bytes (134 MB: 200+ MB).
TOKEN_RUN = 1024 * 1024
# Brackets and the colon become spaces, so that what is left between strings is a list of tokens
# separated by commas and spaces, which orjson reads as an array's items.
_AS_SPACES = bytes.maketrans(b"[]{}:", b"     ")


class AnswerText:
    """A 2xx answer as the server wrote it (`text`) and its small top-level fields, parsed (`head`)."""

    __slots__ = ("head", "spans", "text")

    def __init__(self, text: bytearray, head: dict[str, object], spans: dict[str, tuple[int, int]]) -> None:
        self.text = text
        self.head = head
        self.spans = spans  # the small fields' values: (start, end) in `text`

    def __len__(self) -> int:
        return len(self.text)

    def rename_model(self, name: str) -> None:
        """Set the answer's `model` to `name` (in place: the bytes after it move, none is copied)."""
        if "model" not in self.spans:
            return
        start, end = self.spans.pop("model")
        self.text[start:end] = orjson.dumps(name)
        self.head["model"] = name
        self.spans = {}  # the others moved; nothing reads them after the rename

    def parsed(self) -> object:
        return orjson.loads(self.text)


def read(text: bytes | bytearray) -> AnswerText | None:
    """The answer kept as text, or None when it must be parsed (see the module's docstring)."""
    if not text.isascii() or text.translate(None, _VISIBLE_ASCII):
        return None
    text = text if isinstance(text, bytearray) else bytearray(text)
    start = _skip_spaces(text, 0)
    end = len(text.rstrip(b" "))
    if start >= end or text[start] != ord("{") or text[end - 1] != ord("}"):
        return None
    fields = _fields(text, start + 1, end - 1)
    if fields is None:
        return None
    head, spans = {}, {}
    for key, (value_start, value_end) in fields.items():
        if value_end - value_start > SMALL_FIELD:
            if key in READ_FIELDS or not _tokens_valid(text, value_start, value_end):
                return None
            continue
        try:
            head[key] = orjson.loads(text[value_start:value_end])
        except orjson.JSONDecodeError:
            return None
        spans[key] = (value_start, value_end)
    return AnswerText(text, head, spans)


def _fields(text, start, end):
    """{key: (value start, value end)} of the object whose inside is text[start:end], walking its
    strings; None when it is not the shape read() takes."""
    fields = {}
    depth = 1  # brackets open at `pos` ([ and { alike; each kind must balance on its own too)
    squares = curlies = 0
    pos = start
    key, value_start = None, start
    strings = 0
    while True:
        quote = text.find(b'"', pos, end)
        stop = end if quote == -1 else quote
        between = text[pos:stop].translate(None, _NUMBERS)
        if between.translate(None, _BRACKETS_AND_LITERALS):
            return None
        squares += between.count(b"[") - between.count(b"]")
        curlies += between.count(b"{") - between.count(b"}")
        if squares < 0 or curlies < 0:
            return None
        depth = 1 + squares + curlies
        if quote == -1:
            break
        close = _string_end(text, quote + 1, end)
        if close == -1:
            return None
        strings += 1
        if strings > MAX_STRINGS:
            return None
        pos = close + 1
        if depth != 1:
            continue
        after = _skip_spaces(text, pos)
        if after < end and text[after] == ord(":"):
            if key is not None:
                fields[key] = _value(text, value_start, quote, ending=b",")
                if fields[key] is None:
                    return None
            elif text[start:quote].strip(b" "):
                return None  # something before the first key
            key = orjson.loads(text[quote : close + 1])
            value_start = _skip_spaces(text, after + 1)
            pos = after + 1
    if squares or curlies:
        return None
    if key is not None:
        fields[key] = _value(text, value_start, end, ending=b"")
        if fields[key] is None:
            return None
    elif text[start:end].strip(b" "):
        return None
    return fields


def _tokens_valid(text, start, end):
    """Whether the numbers and literals of text[start:end] (a field's value whose shape `_fields`
    checked) are JSON's, and its strings' escapes too: the value is walked string by string, and
    what lies between is handed to orjson a TOKEN_RUN at a time as an array's items. Measured on
    an embeddings answer of 2,048 x 3,072 floats (124 MB): 0.32 s of CPU on top of the shape's
    0.22 s, and no rise in the traced peak (parsing it whole: 1.13 s, 1.6x its bytes). A valid value whose
    items an empty array or object separates (`[1,[],2]`) reads as invalid and is parsed instead."""
    run: list[bytes] = []
    size = 0
    pos = start
    with memoryview(text) as view:  # released on return: rename_model resizes the text
        while pos < end:
            quote = text.find(b'"', pos, end)
            stop = end if quote == -1 else quote
            while pos < stop:  # the tokens before the string, in runs cut at commas
                cut = _run_end(text, pos, stop)
                tokens = bytes(view[pos:cut]).translate(_AS_SPACES).strip(b" ,")
                pos = cut
                if tokens:
                    run.append(tokens)
                    size += len(tokens)
                if size >= TOKEN_RUN:
                    if not _items_valid(run):
                        return False
                    run, size = [], 0
            if quote == -1:
                break
            close = _string_end(text, quote + 1, end)
            if text.find(b"\\", quote, close) != -1 and not _items_valid([bytes(view[quote : close + 1])]):
                return False  # an escape: the string is parsed to tell
            pos = close + 1
    return _items_valid(run)


def _run_end(text, pos, stop):
    """Where a run of tokens from `pos` ends: `stop`, or after the first comma past TOKEN_RUN bytes."""
    if stop - pos <= TOKEN_RUN:
        return stop
    comma = text.find(b",", pos + TOKEN_RUN, stop)
    return stop if comma == -1 else comma + 1


def _items_valid(run):
    """Whether the runs of tokens, joined by commas, are the items of a JSON array."""
    if not run:
        return True
    try:
        orjson.loads(b"[" + b",".join(run) + b"]")
    except orjson.JSONDecodeError:
        return False
    return True


def _value(text, start, stop, ending):
    """A field's value: from `start` to before `ending` (the comma before the next key, or the
    object's end) at `stop`, spaces trimmed; None when that is not there or empty."""
    end = stop
    while end > start and text[end - 1] == 0x20:
        end -= 1
    if ending:
        if end <= start or text[end - 1] != ending[0]:
            return None
        end -= 1
        while end > start and text[end - 1] == 0x20:
            end -= 1
    return (start, end) if end > start else None


def _string_end(text, pos, end):
    """Where the string whose text starts at `pos` ends (its closing quote), or -1."""
    while True:
        quote = text.find(b'"', pos, end)
        if quote == -1:
            return -1
        backslashes = 0
        while text[quote - 1 - backslashes] == 0x5C:
            backslashes += 1
        if backslashes % 2 == 0:
            return quote
        pos = quote + 1


def _skip_spaces(text, pos):
    while pos < len(text) and text[pos] == 0x20:
        pos += 1
    return pos
