"""Peers that echo a secret back, for the redaction tests of every path (tool executor, MCP, workflow).

`echoes()` draws a credential and what a careless or hostile peer sends back
of it: the whole value, the token alone, in another letter case, or a piece
of 8 characters or more; `assert_no_piece` fails if any 8 characters of the
credential (any letter case) survive in a text.
"""

import string

from hypothesis import strategies as st

# Hex digits in both cases and token punctuation: rich enough for letter-case tricks, and unable
# to spell a word of the messages and JSON around the echo ("completion_tokens"), which would
# look like a surviving piece.
TOKEN_ALPHABET = string.digits + "abcdefABCDEF" + "-._~+/"
MIN_PIECE = 8
CASES = {"as sent": str, "upper": str.upper, "lower": str.lower, "swapped": str.swapcase}


@st.composite
def echoes(draw):
    """(authorization, token, the text echoed back)."""
    token = draw(st.text(TOKEN_ALPHABET, min_size=12, max_size=60))
    authorization = f"Bearer {token}"
    source = draw(st.sampled_from([authorization, token]))
    start = draw(st.integers(0, len(source) - MIN_PIECE))
    end = draw(st.integers(start + MIN_PIECE, len(source)))
    piece = draw(st.sampled_from([source, source[start:end]]))
    return authorization, token, CASES[draw(st.sampled_from(sorted(CASES)))](piece)


def assert_no_piece(text, *secrets):
    folded = _fold(text.replace("[redacted]", "\0"))
    for secret in secrets:
        low = _fold(secret)
        for i in range(len(low) - MIN_PIECE + 1):
            assert low[i : i + MIN_PIECE] not in folded, (
                f"{secret[i : i + MIN_PIECE]!r} of a secret survives in {text!r}"
            )


def _fold(text):
    return "".join(chr(ord(c) + 32) if "A" <= c <= "Z" else c for c in text)
