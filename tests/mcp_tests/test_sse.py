"""The text/event-stream parser the MCP executor reads streams with."""

import pytest

from batches.engine.tools.mcp import SseEvent, SseParser, parse_sse

E = SseEvent

CASES = [
    # (name, stream, events)
    ("lf", "data: a\n\n", [E(data="a")]),
    ("crlf", "data: a\r\n\r\n", [E(data="a")]),
    ("cr", "data: a\r\r", [E(data="a")]),
    ("mixed endings", "data: a\r\ndata: b\rdata: c\n\r\n", [E(data="a\nb\nc")]),
    ("official server framing", 'event: message\r\ndata: {"id":1}\r\n\r\n', [E(data='{"id":1}')]),
    ("multi-line data joined with LF", 'data: {"a":\ndata: 1}\n\n', [E(data='{"a":\n1}')]),
    ("only one space stripped", "data:  two\n\n", [E(data=" two")]),
    ("no space after the colon", "data:x\n\n", [E(data="x")]),
    ("comments ignored", ": ping - 2026-12-02\ndata: a\n: another\n\n", [E(data="a")]),
    ("comment alone dispatches nothing", ": ping\n\n", []),
    ("event type", "event: custom\ndata: a\n\n", [E(event="custom", data="a")]),
    (
        "event type resets per event",
        "event: custom\ndata: a\n\ndata: b\n\n",
        [E(event="custom", data="a"), E(data="b")],
    ),
    ("empty event type means message", "event:\ndata: a\n\n", [E(data="a")]),
    ("id kept across events", "id: 7\ndata: a\n\ndata: b\n\n", [E(data="a", id="7"), E(data="b", id="7")]),
    ("id with NUL ignored", "id: 1\ndata: a\n\nid: x\0y\ndata: b\n\n", [E(data="a", id="1"), E(data="b", id="1")]),
    ("retry", "retry: 1500\ndata: a\n\n", [E(data="a", retry=1500)]),
    ("non-numeric retry ignored", "retry: soon\ndata: a\n\n", [E(data="a")]),
    ("unknown field ignored", "foo: bar\ndata: a\n\n", [E(data="a")]),
    ("field without colon", "data\n\n", [E(data="")]),
    ("priming event: id and empty data", "id: p1\ndata:\n\n", [E(data="", id="p1")]),
    ("no data: not dispatched", "event: x\nid: 3\n\n", []),
    ("several blank lines", "\n\n\ndata: a\n\n\n\n", [E(data="a")]),
    ("leading BOM dropped", "\ufeffdata: a\n\n", [E(data="a")]),
    ("colon in value kept", 'data: {"k": "v:w"}\n\n', [E(data='{"k": "v:w"}')]),
    ("unterminated last event still dispatched", "data: a\n\ndata: b", [E(data="a"), E(data="b")]),
    ("unterminated trailing CR", "data: a\r", [E(data="a")]),
    ("utf-8", "data: caf\u00e9 \u2603\n\n", [E(data="caf\u00e9 \u2603")]),
    (
        "progress then result",
        (
            'event: message\r\ndata: {"method":"notifications/progress"}\r\n\r\n'
            ": ping\r\n"
            'event: message\r\ndata: {"id":2,\r\ndata: "result":{}}\r\n\r\n'
        ),
        [E(data='{"method":"notifications/progress"}'), E(data='{"id":2,\n"result":{}}')],
    ),
]


@pytest.mark.parametrize("stream, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_it_parses(stream, expected):
    assert parse_sse(stream.encode()) == expected


@pytest.mark.parametrize("stream, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_it_parses_the_same_fed_byte_by_byte(stream, expected):
    # Splits every CRLF and every multi-byte character across two chunks.
    parser = SseParser()
    events = []
    for byte in stream.encode():
        events += parser.feed(bytes([byte]))
    assert events + parser.finish() == expected


def test_it_counts_a_crlf_split_across_chunks_once():
    parser = SseParser()
    assert parser.feed(b"data: a\r") == []
    assert parser.feed(b"\n\r") == []
    assert parser.feed(b"\n") == [E(data="a")]
    assert parser.finish() == []


def test_it_replaces_invalid_utf8():
    assert parse_sse(b"data: \xff\n\n") == [E(data="\ufffd")]
