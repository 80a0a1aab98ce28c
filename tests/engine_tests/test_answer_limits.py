"""A model server's answer is bounded: in bytes on the wire and inflated (a gzip bomb stops at
the cap), and in silence once it has begun. Either way the server counts as failed and the call
runs again, never as the record's answer nor as the call time limit."""

import asyncio
import gzip
import zlib

import pytest

from batches.engine.calls.caller import ModelCaller, Upstream
from batches.engine.calls.transport import AnswerTooLarge, IdleTimeout
from tests.engine_tests.test_transport import JSON, Script, _ok, _origin, _post, _run

CAP = 64 * 1024


def _bomb(size, encoding=b"gzip"):
    """`size` zero bytes compressed: a few KB on the wire."""
    body = gzip.compress(b"\0" * size) if encoding == b"gzip" else zlib.compress(b"\0" * size)
    return _ok(body, b"Content-Encoding: " + encoding + b"\r\n")


def _chunked(size):
    chunk = b"x" * 4096
    return (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        + (b"1000\r\n" + chunk + b"\r\n") * (size // 4096)
        + b"0\r\n\r\n"
    )


@pytest.mark.parametrize(
    "answer, why",
    [
        (_ok(b"x" * (CAP + 1)), "announces 65537 bytes"),
        (_chunked(CAP + 4096), "is longer than the 65536-byte cap"),
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + b"x" * (CAP + 10), "is longer than"),
        (_bomb(100 * CAP), "gzip answer inflates to more than the 65536-byte cap"),
        (_bomb(100 * CAP, b"deflate"), "deflate answer inflates to more than"),
    ],
    # Named ids: a gzip body carries its time, so ids made from it differ between xdist workers.
    ids=["content-length", "chunked", "until-close", "gzip bomb", "deflate bomb"],
)
def test_an_answer_over_the_cap_fails_and_its_connection_is_dropped(answer, why):
    async def go():
        async with Script([answer, _ok()]) as server:
            origin = _origin(server.port, max_answer_bytes=CAP)
            with pytest.raises(AnswerTooLarge, match=why):
                await _post(origin)
            after = await _post(origin)
            return server.connections, after

    connections, after = _run(go())
    assert after.body == JSON and connections == 2


def test_answers_up_to_the_cap_arrive_whole():
    exact = b'"' + b"x" * (CAP - 2) + b'"'

    async def go():
        async with Script([_ok(exact), _ok(gzip.compress(exact), b"Content-Encoding: gzip\r\n")]) as server:
            origin = _origin(server.port, max_answer_bytes=CAP)
            return await _post(origin), await _post(origin)

    plain, inflated = _run(go())
    assert plain.body == exact and inflated.body == exact


def test_a_truncated_gzip_stream_is_a_bad_answer():
    body = gzip.compress(JSON * 100)[:-12]

    async def go():
        async with Script([_ok(body, b"Content-Encoding: gzip\r\n")]) as server:
            with pytest.raises(Exception, match="cut short"):
                await _post(_origin(server.port))

    _run(go())


def _silent_after(head_and_some):
    async def answer(writer):
        writer.write(head_and_some)
        await writer.drain()
        await asyncio.sleep(3600)

    return answer


SILENT = _silent_after(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"choices": [')


def test_cut_idle_fails_an_answer_that_went_silent_not_one_that_has_not_begun():
    async def go():
        async with Script([SILENT, _silent_after(b""), _ok()]) as server:
            origin = _origin(server.port)
            silent = asyncio.create_task(_post(origin))
            thinking = asyncio.create_task(_post(origin))
            while len(server.requests) < 2:
                await asyncio.sleep(0.01)
            deadline = asyncio.get_running_loop().time() + 5
            while not silent.done():
                assert asyncio.get_running_loop().time() < deadline
                origin.cut_idle(asyncio.get_running_loop().time(), 0.2)
                await asyncio.sleep(0.05)
            assert not thinking.done()  # no byte of it yet: the server may still be working
            thinking.cancel()
            with pytest.raises(IdleTimeout):
                await silent
            return await _post(origin)

    assert _run(go()).body == JSON


def test_a_server_silent_mid_answer_is_cut_after_the_idle_timeout_and_the_call_runs_again():
    async def go():
        async with Script([SILENT, _ok()] + [_ok()] * 4) as server:
            upstream = Upstream(f"http://127.0.0.1:{server.port}/v1", "m", "", 4)
            async with ModelCaller([upstream], time_limit_s=60, retries=0, idle_timeout_s=0.3) as caller:
                started = asyncio.get_running_loop().time()
                result = await caller.call("/v1/chat/completions", {"messages": []})
                took = asyncio.get_running_loop().time() - started
            return result, took, upstream, server

    result, took, upstream, server = _run(go())
    assert result.ok and result.body == {"ok": True}
    assert 0.3 <= took < 10  # cut after the idle timeout, nowhere near the 60 s call limit
    calls = [body for _, head, body in server.requests if b"/chat/completions" in head]
    # The cut call, the neutral request that judged it (answered: the deployment stays in), the call sent again.
    assert len(calls) == 3 and b'"max_tokens":1' in calls[1]
    assert upstream.healthy


def test_an_oversized_answer_is_sent_again_and_the_request_fails_alone_after_three():
    async def go():
        big = _ok(b"x" * (CAP + 1))
        probe_ok = _ok(b'{"data": []}')
        async with Script([big, probe_ok, big, probe_ok, big] + [probe_ok] * 5) as server:
            upstream = Upstream(f"http://127.0.0.1:{server.port}/v1", "m", "sk-KEY-0123456789", 4, max_answer_bytes=CAP)
            async with ModelCaller([upstream], time_limit_s=60, retries=0) as caller:
                return await caller.call("/v1/chat/completions", {"messages": []}), upstream

    result, upstream = _run(go())
    # The server answered the neutral requests between them: the oversized answers are the request's own.
    assert (result.kind, result.code) == ("unavailable", "record_fails_upstream")
    assert result.message.startswith("The model server failed this request 3 times while it answered other requests")
    assert "announces 65537 bytes, over the 65536-byte cap" in result.message
    assert upstream.healthy


def test_the_default_cap_fits_2048_embeddings_of_3072_dimensions():
    from django.conf import settings

    # ~137 MB as vLLM or OpenAI write them (22-23 bytes a float); see transport.DEFAULT_MAX_ANSWER_BYTES.
    assert 2048 * 3072 * 22.5 < settings.OPENRELAY_MAX_MODEL_RESPONSE_BYTES < 160 * 1024 * 1024
