"""A TCP proxy the test can cut: a network partition between one process and a server, on one host.

`TcpProxy(port)` listens on 127.0.0.1 and relays every connection to 127.0.0.1:`port`, in a thread
of its own. `blackhole()` stops relaying in both directions without closing anything: no FIN, no
RST, the bytes wait in the sockets' buffers as they would in a network that drops packets, and new
connections are accepted but go nowhere. `heal()` relays again, the waiting bytes first. What a
loopback proxy cannot do is drop the packets themselves: the kernel still acknowledges them, so
TCP keepalives and tcp_user_timeout see a healthy peer here (the network-namespace tier tests those).
"""

import asyncio
import contextlib
import threading


class TcpProxy:
    def __init__(self, port):
        self.target = port
        self.port = None
        self.open = None  # set while relaying (an asyncio.Event, on the proxy's loop)
        self.loop = asyncio.new_event_loop()
        self.tasks = set()

    def __enter__(self):
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ready,), daemon=True, name="tcp-proxy")
        self.thread.start()
        assert ready.wait(10), "the proxy did not start"
        return self

    def __exit__(self, *exc):
        asyncio.run_coroutine_threadsafe(self._close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def blackhole(self):
        self.loop.call_soon_threadsafe(self.open.clear)

    def heal(self):
        self.loop.call_soon_threadsafe(self.open.set)

    def _run(self, ready):
        asyncio.set_event_loop(self.loop)
        self.open = asyncio.Event()
        self.open.set()
        self.server = self.loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = self.server.sockets[0].getsockname()[1]
        ready.set()
        self.loop.run_forever()

    async def _close(self):
        self.server.close()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _serve(self, reader, writer):
        self.tasks.add(asyncio.current_task())
        try:
            await self.open.wait()  # a connection made during the cut: accepted, and no further
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.tasks.discard(asyncio.current_task())
            writer.close()

    async def _pipe(self, reader, writer):
        try:
            while True:
                await self.open.wait()  # cut: read nothing, so nothing is relayed
                data = await reader.read(65536)
                if not data:
                    break
                await self.open.wait()  # cut while reading: the bytes wait here
                writer.write(data)
                await writer.drain()
        finally:
            with contextlib.suppress(Exception):
                writer.close()
