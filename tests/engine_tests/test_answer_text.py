"""Big answers kept as JSON text (batches.engine.calls.answer_text): what `read` takes, what it
leaves to the parser (a malformed token too, through the engine), and the rename of `model` in place."""

import orjson
import pytest
from aiohttp import web

from batches.engine.calls import answer_text
from batches.engine.runner import run_batch
from openrelay.core.models import Deployment
from openrelay.simulator.server import AppThread
from tests.helpers import make_batch, read_lines

EMBEDDINGS = orjson.dumps(
    {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": [0.25, -1.5e-3, 3]} for i in range(3)],
        "model": "up-model",
        "usage": {"prompt_tokens": 3, "total_tokens": 3},
    }
)


def test_it_reads_the_small_top_level_fields_and_keeps_the_text():
    kept = answer_text.read(EMBEDDINGS)
    assert kept is not None and bytes(kept.text) == EMBEDDINGS
    assert kept.head["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    assert kept.head["model"] == "up-model" and kept.head["object"] == "list"


def test_big_fields_are_left_as_text(monkeypatch):
    monkeypatch.setattr(answer_text, "SMALL_FIELD", 40)
    kept = answer_text.read(EMBEDDINGS)
    assert kept is not None and "data" not in kept.head and kept.head["model"] == "up-model"


def test_the_rename_sets_model_in_place_and_keeps_the_rest():
    kept = answer_text.read(b'{ "model" : "up", "a": "x\\"y", "b": [1, {"c": "]"}], "usage": {"prompt_tokens": 1} }')
    kept.rename_model("catalog/name")
    assert orjson.loads(kept.text) == {
        "model": "catalog/name",
        "a": 'x"y',
        "b": [1, {"c": "]"}],
        "usage": {"prompt_tokens": 1},
    }


@pytest.mark.parametrize(
    "text",
    [
        b'{"a":1,}',  # a comma without a field
        b'{"a":[1}',  # brackets that do not balance
        b'{"a":1 "b":2}',  # no comma between fields
        b'{"a":tru?}',  # a character JSON has no place for
        b'{"a":"no end}',  # a string that does not end
        b"[1, 2]",  # not an object
        b'{"a":\n1}',  # a line break: not one line of a result file
        '{"a":"é"}'.encode(),  # not ASCII: the parser checks its UTF-8
    ],
)
def test_what_is_not_the_simple_shape_is_left_to_the_parser(text):
    assert answer_text.read(text) is None


def test_an_answer_whose_choices_are_big_is_parsed(monkeypatch):
    # The usage rules read the choices (implausible usage): they must be parsed.
    monkeypatch.setattr(answer_text, "SMALL_FIELD", 10)
    text = orjson.dumps({"choices": [{"message": {"content": "x" * 50}}], "usage": {"prompt_tokens": 1}})
    assert answer_text.read(text) is None


def big(value: bytes) -> bytes:
    """An answer whose `data` is `value`, past SMALL_FIELD (padded with valid numbers), so it is kept as text."""
    pad = b",".join([b"0.125"] * (answer_text.SMALL_FIELD // 5))
    return b'{"object":"list","data":[' + pad + b"," + value + b',{"s":"x"}],"model":"m","usage":{"prompt_tokens":1}}'


@pytest.mark.parametrize(
    "value",
    [
        b"1.2.3",  # two decimal points
        b"-",  # a sign alone
        b"01",  # a leading zero
        b".5",  # no digit before the point
        b"1e",  # an exponent without digits
        b"tru",  # a literal cut short
        b"nulll",
        b"1 2",  # two numbers without a comma
        b'"a\\qb"',  # an escape JSON does not have
    ],
)
def test_a_big_field_with_a_token_json_does_not_allow_is_left_to_the_parser(value):
    # Kept as text, it would reach the result file as a line no JSON reader takes (the caller
    # parses instead, and a body that is not JSON is the call's error).
    text = big(value)
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(text)
    assert answer_text.read(text) is None


@pytest.mark.parametrize(
    "value",
    [b"-0.5e-3", b"1E+9", b"true", b"false", b"null", b"[[1, 2], [3]]", b'{"k": [0, -1]}', b'"a\\"b\\\\c\\u00e9"'],
)
def test_a_big_field_of_json_tokens_is_kept(value):
    text = big(value)
    kept = answer_text.read(text)
    assert kept is not None and "data" not in kept.head
    assert orjson.loads(kept.text) == orjson.loads(text)


def test_tokens_are_checked_in_runs_across_their_cuts(monkeypatch):
    # Runs of a few bytes: every cut falls between tokens, never inside one.
    monkeypatch.setattr(answer_text, "TOKEN_RUN", 7)
    assert answer_text.read(big(b"[123456789, -2.5e10, [true, null]], 42")) is not None
    assert answer_text.read(big(b"[123456789, -2.5e10, [true, nul]], 42")) is None


@pytest.mark.usefixtures("tmp_storage")
def test_a_big_answer_with_a_malformed_number_fails_its_record_and_every_result_line_is_json(alice, model):
    # A server whose big embeddings answer carries `1.2.3` for one input, through the engine:
    # the record fails (a body that is not JSON), its neighbours land, and both files read.
    floats = b",".join([b"0.125"] * (answer_text.BIG_BYTES // 5))

    async def answer(request):
        body = await request.json()
        bad = b",1.2.3" if body["input"] == "bad" else b""
        data = b'[{"object":"embedding","index":0,"embedding":[' + floats + bad + b"]}]"
        text = b'{"object":"list","data":' + data + b',"model":"up","usage":{"prompt_tokens":1,"total_tokens":1}}'
        return web.Response(body=text, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/embeddings", answer)
    with AppThread(app, name="malformed") as server:
        Deployment.objects.filter(model=model).update(base_url=f"{server.url}/v1")
        bodies = [{"model": model.name, "input": text} for text in ("good 1", "bad", "good 2")]
        batch = make_batch(alice.org, bodies, endpoint="/v1/embeddings")
        run_batch(batch.pk)
    batch.refresh_from_db()
    out, err = read_lines(batch.output_file), read_lines(batch.error_file)  # orjson fails on a bad line
    assert (batch.completed_count, batch.failed_count) == (2, 1)
    assert sorted(line["custom_id"] for line in out) == ["req-1", "req-3"]
    assert [line["custom_id"] for line in err] == ["req-2"]
    assert len(out[0]["response"]["body"]["data"][0]["embedding"]) == answer_text.BIG_BYTES // 5
