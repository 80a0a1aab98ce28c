"""A refused host reads the same whatever the reason, so result files can't map internal names:
a name that resolves to a private address, one that does not resolve, a blocked literal, a
legacy numeric spelling and a zone id all give one message (and one kind)."""

import asyncio

import pytest

from batches.engine.tools.base import ToolExecutionFailed
from batches.engine.tools.http_executor import HttpExecutor
from openrelay.lib.outbound import HOST_REFUSED, OutboundClient, OutboundError, check_url

REFUSED = [
    "http://localhost:9/tools",  # resolves to loopback
    "http://no-such-host.invalid/tools",  # does not resolve (.invalid never does)
    "http://10.0.0.1/tools",
    "http://[::1]:9/tools",
    "http://0x7f.1/tools",
    "http://[fe80::1%25eth0]/tools",
]


def _refusal(url):
    async def go():
        async with OutboundClient(allow_private=False) as client:
            try:
                await client.post_json(url, {}, timeout_s=5)
            except OutboundError as exc:
                return exc.kind, exc.message
        raise AssertionError(f"{url} was called")

    return asyncio.run(go())


def _reason(message):
    origin, _, reason = message.partition(": ")  # the origin is the user's own input
    return reason


def test_every_refused_host_gets_the_same_message():
    refusals = [_refusal(url) for url in REFUSED]
    assert {(kind, _reason(message)) for kind, message in refusals} == {("blocked", HOST_REFUSED)}


def test_the_tool_executor_says_the_same_for_each():
    async def message(url):
        async with OutboundClient(allow_private=False) as outbound:
            with pytest.raises(ToolExecutionFailed) as caught:
                await HttpExecutor(outbound, "r", {"url": url, "timeout_ms": 5000}).execute(
                    [{"id": "c", "function": {"name": "f", "arguments": "{}"}}]
                )
            return str(caught.value)

    messages = {
        _reason(asyncio.run(message(url)).removeprefix("The tool executor URL is blocked: ")) for url in REFUSED
    }
    assert messages == {f"{HOST_REFUSED}."}


def test_check_url_refuses_literals_in_the_same_words():
    for url in ("http://10.0.0.1/", "http://0x7f.1/", "http://[fe80::1%25eth0]/"):
        with pytest.raises(OutboundError) as caught:
            check_url(url, allow_private=False)
        assert _reason(caught.value.message) == HOST_REFUSED
