"""openrelay.lib.redaction: every piece of a secret of 8 characters or more goes, in any letter case,
before any cut."""

from hypothesis import given, settings
from hypothesis import strategies as st

from openrelay.lib.redaction import REDACTED, redact, redact_json, secrets_of
from tests.echoes import assert_no_piece, echoes

FILLER = st.text(max_size=300)


def test_it_removes_the_value_and_the_credential_in_any_case():
    secrets = secrets_of("Bearer TOOLSECRET-0123456789")
    assert secrets == ("Bearer TOOLSECRET-0123456789", "TOOLSECRET-0123456789")
    assert redact("got 'bearer toolsecret-0123456789'", secrets) == f"got '{REDACTED}'"
    assert redact("id TOOLSECRET-0123 end", secrets) == f"id {REDACTED} end"
    assert redact("tail=23456789.", secrets) == f"tail={REDACTED}."


def test_pieces_shorter_than_eight_characters_stay():
    secrets = secrets_of("Bearer TOOLSECRET-0123456789")
    assert redact("TOOLSEC and 0123456", secrets) == "TOOLSEC and 0123456"
    assert redact("a short credential: abc", secrets_of("Basic abc")) == "a short credential: abc"


def test_it_redacts_before_it_cuts():
    token = "wf-SECRET-b6e0d1-0123ab"  # 22 characters placed across the cut
    text = "x" * 1995 + token + " and more"
    cut = redact(text, secrets_of(f"Bearer {token}"), 2000)
    assert len(cut) <= 2000 and cut.endswith("...")
    assert_no_piece(cut, token)


def test_it_leaves_text_without_secrets_alone_and_unicode_in_place():
    assert redact("İstanbul: nothing here", secrets_of("Bearer 0123456789abc")) == "İstanbul: nothing here"
    assert redact("İİ Bearer 0123456789ABC İ", secrets_of("Bearer 0123456789abc")) == f"İİ {REDACTED} İ"
    assert redact("anything", ()) == "anything"


def test_redact_json_reaches_every_string_and_key():
    secrets = secrets_of("Bearer 0123456789abc")
    value = {"a": ["x 0123456789ABC", 7, None], "0123456789abc": {"b": "bearer 0123456789abc"}}
    assert redact_json(value, secrets) == {"a": [f"x {REDACTED}", 7, None], REDACTED: {"b": REDACTED}}


@settings(max_examples=300, deadline=None)
@given(echoes(), FILLER, FILLER, st.one_of(st.none(), st.integers(1, 400)))
def test_no_piece_of_a_secret_survives_wherever_it_is_echoed(echo, before, after, limit):
    authorization, token, echoed = echo
    text = redact(before + echoed + after, secrets_of(authorization), limit)
    assert_no_piece(text, authorization, token)
    if limit is not None:
        assert len(text) <= max(limit, 3)
