"""A turn's MCP tool calls run at most OPENRELAY_TOOL_PARALLEL_CALLS at once; the rest wait their turn.

The executor's requests are counted where they leave it (a wrapper around the
real OutboundClient it is given), and the hand-written server answers a
tools/call only once as many calls are in flight as the bound allows (or
every call left is). So the peak is the bound exactly: without a bound all
ten leave at once, and a tighter bound never fills the server and runs into
timeout_ms.
"""

import asyncio

from batches.engine.context import RecordContext
from batches.engine.tools.executors import make_executor
from openrelay.lib.outbound import OutboundClient

from .conftest import config, handshake_ok, rpc_response, scripted_server, text_result, tool_call

CALLS = 10


class Counting:
    """The real OutboundClient, counting the requests in flight through it."""

    def __init__(self, outbound):
        self.outbound = outbound
        self.max_response_bytes = outbound.max_response_bytes
        self.now = self.peak = 0

    async def post_json(self, *args, **kwargs):
        self.now += 1
        self.peak = max(self.peak, self.now)
        try:
            return await self.outbound.post_json(*args, **kwargs)
        finally:
            self.now -= 1

    async def delete(self, *args, **kwargs):
        return await self.outbound.delete(*args, **kwargs)


class FillingServer:
    """tools/call handler: holds each call until the in-flight count is the most it can be."""

    def __init__(self, bound, total):
        self.bound, self.total = bound, total
        self.now = self.peak = self.finished = 0
        self.changed = asyncio.Condition()

    def full(self):
        return self.now >= min(self.bound, self.total - self.finished)

    async def __call__(self, seen):
        answered = await handshake_ok(seen)
        if answered is not None:
            return answered
        async with self.changed:
            self.now += 1
            self.peak = max(self.peak, self.now)
            self.changed.notify_all()
            await self.changed.wait_for(self.full)
            self.now -= 1
            self.finished += 1
            self.changed.notify_all()
        return rpc_response(seen, result=text_result(f"answer {seen.message['params']['arguments']['query']}"))


def test_it_runs_a_turns_calls_at_most_the_setting_at_once_and_in_order(settings):
    settings.OPENRELAY_TOOL_PARALLEL_CALLS = 3
    calls = [tool_call(arguments=f'{{"query": "q{i}"}}', call_id=f"call_{i}") for i in range(CALLS)]

    async def scenario():
        server = FillingServer(bound=3, total=CALLS)
        async with scripted_server(server) as mcp, OutboundClient(allow_private=True) as real:
            outbound = Counting(real)
            ctx = RecordContext(1, "batch_test", 7, "/v1/chat/completions", "sim-model", None, outbound=outbound)
            executor = make_executor(ctx, "req-1", config(mcp.url))
            try:
                results = await executor.execute(calls)
            finally:
                await executor.close()
        return outbound, server, results

    outbound, server, results = asyncio.run(scenario())
    assert outbound.peak == 3 and server.peak == 3 and server.finished == CALLS
    assert [(r.tool_call_id, r.content) for r in results] == [(f"call_{i}", f"answer q{i}") for i in range(CALLS)]
