"""Secrets out of what peers send us: the one redaction every peer's text goes through.

A tool executor, an MCP server, a workflow callback, a webhook endpoint or a
model server may quote back what we sent it, its credential included, and
that text becomes a message: an error line in a result file, a column the
admin shows, a log line, a tool message the model reads. A careless or
hostile peer may also change the secret's letter case or send only a part
of it. So every piece of a secret MIN_PIECE characters long or longer is
removed, in any letter case. Shorter pieces stay: they can't be told from
ordinary words, and 7 characters of a token unlock nothing.

Redaction runs before truncation (`limit`): a cut made first can keep the
front of a secret whose tail it dropped, and too little of it may be left to
recognise (a 22-character token cut after 21 leaked those 21).
"""

import functools
from collections.abc import Iterable

MIN_PIECE = 8
REDACTED = "[redacted]"
# Case is folded for ASCII letters only, so positions in the folded text are
# positions in the text: str.lower() changes the length of a few characters
# ("İ" becomes two). Secrets are header values, ASCII in practice.
_ASCII_LOWER = {code: code + 32 for code in range(ord("A"), ord("Z") + 1)}


def secrets_of(*values: str | None) -> tuple[str, ...]:
    """The secrets to look for, given credentials as sent: each value and, for an
    `Authorization` value ("Bearer tok"), the credential after the scheme too."""
    found = []
    for value in values:
        if not value:
            continue
        found.append(value)
        _scheme, _, credential = value.strip().partition(" ")
        if credential.strip():
            found.append(credential.strip())
    return tuple(found)


def redact(text: str, secrets: Iterable[str], limit: int | None = None) -> str:
    """`text` with every piece of each secret (MIN_PIECE characters or more, any letter case)
    replaced by "[redacted]", then cut to `limit` characters (ending "...") if given."""
    if limit is not None:
        # Bounds the work for huge peer text: a run of secret pieces becomes 10
        # characters, so more than this can't be needed for `limit` characters
        # of answer, and a cut here leaves at most MIN_PIECE - 1 of a secret.
        text = text[: 4 * limit + MIN_PIECE]
    pieces = _pieces(secrets)
    if pieces:
        text = _remove(text, pieces)
    if limit is not None and len(text) > limit:
        text = text[: max(0, limit - 3)] + "..."
    return text


def redact_json(value, secrets):
    """A JSON value (what a peer answered) with `redact` applied to every string in it, keys too."""
    if not _pieces(secrets):
        return value
    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, list):
        return [redact_json(item, secrets) for item in value]
    if isinstance(value, dict):
        return {redact(key, secrets): redact_json(item, secrets) for key, item in value.items()}
    return value


def _fold(text):
    return text.lower() if text.isascii() else text.translate(_ASCII_LOWER)


def _pieces(secrets):
    return _pieces_of(tuple(secrets))


# A model server's request id is redacted on every call with the same few secrets: built once.
@functools.lru_cache(maxsize=1024)
def _pieces_of(secrets):
    pieces = set()
    for secret in secrets:
        if secret and len(secret) >= MIN_PIECE:
            folded = _fold(secret)
            pieces.update(folded[i : i + MIN_PIECE] for i in range(len(folded) - MIN_PIECE + 1))
    return frozenset(pieces)


def _remove(text, pieces):
    folded = _fold(text)
    windows = len(folded) - MIN_PIECE + 1
    if windows < len(pieces):
        # Short text (a request id): each of its windows looked up, not each piece searched for.
        spans = [(i, i + MIN_PIECE) for i in range(windows) if folded[i : i + MIN_PIECE] in pieces]
    else:
        spans = []
        for piece in pieces:
            start = folded.find(piece)
            while start != -1:
                spans.append((start, start + MIN_PIECE))
                start = folded.find(piece, start + 1)
    if not spans:
        return text
    parts, kept_to = [], 0
    for start, end in _runs(spans):
        # The space of "Bearer tok" is part of a secret's pieces; the text keeps its own spaces.
        while start < end and text[start].isspace():
            start += 1
        while end > start and text[end - 1].isspace():
            end -= 1
        if start < end:
            parts += [text[kept_to:start], REDACTED]
            kept_to = end
    parts.append(text[kept_to:])
    return "".join(parts)


def _runs(spans):
    """Overlapping or touching spans merged, in order."""
    spans.sort()
    run_start, run_end = spans[0]
    for start, end in spans[1:]:
        if start <= run_end:
            run_end = max(run_end, end)
            continue
        yield run_start, run_end
        run_start, run_end = start, end
    yield run_start, run_end
