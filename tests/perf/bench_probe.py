"""The simulated model server with an arrival clock, for `manage.py bench`.

    .venv/bin/python -m tests.perf.bench_probe --port PORT [--latency-ms N]

The simulator of openrelay.simulator (recording off), plus one middleware
that notes the wall-clock time (time.time(), comparable across processes on
one machine) of the first and last model call since the last reset:
`GET /_bench/arrivals` -> {"count", "first_at", "last_at"};
`POST /_bench/reset` forgets them. The benchmark uses it to time "create's
answer -> first call at the model server".
"""

import argparse
import asyncio
import signal
import time

from aiohttp import web

from openrelay.simulator.config import SimulatorConfig
from openrelay.simulator.server import _start_site, bind_socket, build_app, json_response, make_runner


class Arrivals:
    def __init__(self):
        self.reset()

    def reset(self):
        self.count, self.first_at, self.last_at = 0, None, None

    def as_dict(self):
        return {"count": self.count, "first_at": self.first_at, "last_at": self.last_at}


def build_probe_app(config):
    app = build_app(config)
    arrivals = Arrivals()

    @web.middleware
    async def clock(request, handler):
        # The simulator's last route is a catch-all, so the probe's own two
        # routes are answered here, before routing gets a say.
        if request.path == "/_bench/arrivals":
            return json_response(arrivals.as_dict())
        if request.path == "/_bench/reset":
            arrivals.reset()
            return json_response({"reset": True})
        if request.method == "POST" and request.path.startswith("/v1/"):
            now = time.time()
            arrivals.count += 1
            arrivals.first_at = arrivals.first_at or now
            arrivals.last_at = now
        return await handler(request)

    app.middlewares.append(clock)
    return app


async def serve(port, latency_ms):
    runner = make_runner(build_probe_app(SimulatorConfig(latency_ms=latency_ms, record=False)))
    sock = bind_socket("127.0.0.1", port)
    await _start_site(runner, sock)
    print(f"probe on http://127.0.0.1:{sock.getsockname()[1]}/v1", flush=True)
    stopping = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(signum, stopping.set)
    try:
        await stopping.wait()
    finally:
        await runner.cleanup()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    args = parser.parse_args(argv)
    asyncio.run(serve(args.port, args.latency_ms))


if __name__ == "__main__":
    main()
