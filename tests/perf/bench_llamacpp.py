"""The bench's llama.cpp row (22, issue 55): flow control against a real llama.cpp server, no loss.

Opt-in (`manage.py bench --only llamacpp`), and skipped when no llama-server is built: build it first with
`tests/real/llamacpp_build.py` (13 minutes on 2 shared cores; it lands in ~/.cache/openrelay-real, or
OPENRELAY_REAL_CACHE), which also makes the tiny random-weight GGUF of tests/real/make_tiny_gguf.py.

llama.cpp queues past its slots (no 503s), so the question is throughput and the line it keeps. Two servers
of SLOTS slots, THREADS threads each: one serves under PREFIX, so its /metrics is not at the root where the
engines look for it (batches/engine/calls/flow.py, MetricsReader): the latency rules alone steer; the other
serves at the root and its `llamacpp:requests_deferred` / `requests_processing` steer. In turn, ROUNDS times
over: a bare aiohttp client holding BARE_IN_FLIGHT calls (every slot busy, a line waiting) measures a server's
maximum, then a batch of the same kind of records runs through a fresh default cluster (two workers) with
max_concurrency CEILING. Rates run from the first answer (finished record) to the last; the bench samples the
server's own /metrics every SAMPLE_EVERY_S meanwhile for the line it kept. The server and the gateway share
the machine's cores: both take turns with the bare client, so load hits them alike.
"""

import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

import httpx

from tests.perf.bench_flow import REFUSAL_WORKERS, _write
from tests.perf.common import Sampler, wait_http

SLOTS = 4
THREADS = 1  # llama-server's compute threads: fixed, so the server's share of the 2 cores is too
SLOT_CONTEXT = 256
OUTPUT_TOKENS = 64  # every answer this long (ignore_eos): calls of one length, as the simulator's rows
CEILING = 256  # max_concurrency: far above the slots, as row 18's
BARE_IN_FLIGHT = 2 * SLOTS
PREFIX = "/behind"  # the latency path's server serves under it: the engines find no /metrics at its root
PATHS = ("latency", "metrics")
ROUNDS = 2
RUN_SECONDS = 30  # each gateway run's length at the bare maximum
BARE_SECONDS = 15
SAMPLE_EVERY_S = 0.25
UPSTREAM = "tiny-upstream"


def built(cache=None):
    """(llama-server, the tiny GGUF) when tests/real/llamacpp_build.py has built them, else None.
    The model is made here when the server and its tool venv are built but the model is not."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "real"))
    import llamacpp_build

    cache = cache or llamacpp_build.cache_dir()
    binary = cache / "bin" / "llama-server"
    if not binary.exists():
        return None
    model = cache / "tiny.gguf"
    if not model.exists():
        if not (cache / "venv" / "bin" / "python").exists():
            return None
        import llamacpp

        model = llamacpp.tiny_model(cache)
    return binary, model


def bodies(count, run):
    """`count` chat bodies whose prompts no earlier run sent (`run` names it), so no prompt cache helps."""
    return [
        {
            "messages": [{"role": "user", "content": f"Run {run}, ticket {i}: summarise the customer's complaint."}],
            "max_tokens": OUTPUT_TOKENS,
            "ignore_eos": True,
        }
        for i in range(count)
    ]


def read_line(text):
    """(deferred, processing) from llama-server's /metrics page."""
    found = {}
    for line in text.splitlines():
        for name in ("llamacpp:requests_deferred", "llamacpp:requests_processing"):
            if line.startswith(name + " "):
                found[name] = float(line.split()[1])
    return found.get("llamacpp:requests_deferred"), found.get("llamacpp:requests_processing")


class LineSampler(Sampler):
    """The server's own line, read every SAMPLE_EVERY_S while the run goes: (deferred, processing)."""

    def __init__(self, metrics_url):
        super().__init__(SAMPLE_EVERY_S)
        self.url = metrics_url
        self.samples = []
        self.client = httpx.Client(timeout=5)

    def __exit__(self, *exc):
        super().__exit__(*exc)
        self.client.close()

    def sample(self):
        try:
            deferred, processing = read_line(self.client.get(self.url).text)
        except httpx.HTTPError:
            return
        if deferred is not None and processing is not None:
            self.samples.append((deferred, processing))

    def figures(self):
        """What the server kept while it worked (samples with a slot busy): mean and most deferred, mean busy."""
        busy = [s for s in self.samples if s[1] > 0] or [(0.0, 0.0)]
        return {
            "deferred_mean": statistics.fmean(d for d, _ in busy),
            "deferred_max": max(d for d, _ in busy),
            "processing_mean": statistics.fmean(p for _, p in busy),
            "samples": len(busy),
        }


def bare_rate(api_url, batch):
    """The server's maximum: a bare aiohttp client holding BARE_IN_FLIGHT calls; (records a second from the
    first answer to the last, failed calls)."""

    async def go():
        import aiohttp  # the bare client of rows 3 and 12

        todo = iter(batch)
        answered, failed = [], []
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=BARE_IN_FLIGHT)) as client:

            async def worker():
                for body in todo:
                    async with client.post(f"{api_url}/chat/completions", json={"model": UPSTREAM, **body}) as answer:
                        await answer.read()
                        (answered if answer.status == 200 else failed).append(time.monotonic())

            await asyncio.gather(*(worker() for _ in range(BARE_IN_FLIGHT)))
        return (len(answered) - 1) / max(1e-6, answered[-1] - answered[0]), len(failed)

    return asyncio.run(go())


class LlamaRuns:
    """Row 22, given the bench (its stack, API client, rows and reporting)."""

    def __init__(self, bench):
        self.bench = bench
        self.stack = bench.stack

    def start_server(self, binary, model, prefix=""):
        """A llama-server (SLOTS slots, THREADS threads, --metrics, no host prompt cache) serving under
        `prefix`; its base URL (with the prefix)."""
        from tests.perf.bench_engine import _free_port

        port = _free_port()
        import llamacpp_build  # on sys.path since `built` found the binary

        # --cache-ram 0: llama.cpp's host prompt cache (8 GiB by default) would serve a prompt seen before.
        argv = llamacpp_build.server_argv(
            binary, model, port, slots=SLOTS, slot_context=SLOT_CONTEXT, threads=THREADS, extra=("--cache-ram", 0)
        )
        if prefix:
            argv += ["--api-prefix", prefix]
        process = self.stack.spawn(f"llama-server{prefix.replace('/', '-')}", argv)
        base = f"http://127.0.0.1:{port}{prefix}"
        wait_http(process, f"{base}/health")
        deadline = time.monotonic() + 120
        while httpx.get(f"{base}/health", timeout=5).status_code != 200:  # 503 while the model loads
            if time.monotonic() > deadline:
                raise RuntimeError(f"{base} did not load its model")
            time.sleep(0.1)
        return base

    def gateway(self, path, base, records, run, timeout_s):
        """One batch of `records` on a fresh default cluster against the server at `base`, the one deployment
        of the path's model (set_model adds a deployment for each URL): (rate, failed, line figures)."""
        from tests.perf.bench_flow import FlowRuns

        bench, stack = self.bench, self.stack
        bench.release_shared()
        model = f"bench/llamacpp-{path}"
        stack.manage(
            "set_model",
            model,
            "--base-url",
            f"{base}/v1",
            "--upstream-model",
            UPSTREAM,
            "--concurrency",
            str(CEILING),
            "--input-price",
            "0.20",
            "--output-price",
            "0.80",
        )
        _write(bench.tmp / f"llamacpp-{run}.jsonl", bodies(records, run), model)
        file_id, _ = bench.api.upload(bench.tmp / f"llamacpp-{run}.jsonl")
        cluster = stack.start_cluster(REFUSAL_WORKERS)
        try:
            with LineSampler(f"{base}/metrics") as line:
                batch, _, _ = bench.api.create(file_id)
                row = bench.wait_done(batch["id"], timeout_s)
        finally:
            stack.stop_cluster(cluster)
        return FlowRuns(bench).finishing_rate(batch["id"], row["completed"] + row["failed"]), row["failed"], line

    def run(self):
        from tests.perf.bench_engine import TARGETS, Row

        bench = self.bench
        found = built()
        if found is None:
            bench.rows["llamacpp_flow"] = Row(
                "llamacpp_flow",
                22,
                "flow control against a real llama.cpp server",
                "skipped: no llama-server built (tests/real/llamacpp_build.py)",
                TARGETS["llamacpp_flow"],
                None,
            )
            bench.report("22: skipped, no llama-server built (run tests/real/llamacpp_build.py)")
            return
        binary, model = found
        servers = {"latency": self.start_server(binary, model, PREFIX), "metrics": self.start_server(binary, model)}
        runs = []
        for turn in range(ROUNDS):
            for path in PATHS:
                base = servers[path]
                api = f"{base}/v1"
                sizing = bare_rate(api, bodies(4 * SLOTS, f"warm-{path}-{turn}"))[0]  # warm, and how many to send
                with LineSampler(f"{base}/metrics") as bare_line:
                    bare, bare_failed = bare_rate(api, bodies(max(50, int(sizing * BARE_SECONDS)), f"bare-{turn}"))
                records = max(100, int(bare * (4 if bench.scale.quick else RUN_SECONDS)))
                load = os.getloadavg()[0]
                rate, failed, line = self.gateway(path, base, records, f"{path}-{turn}", 120 + 4 * records / bare)
                runs.append(
                    {
                        "path": path,
                        "turn": turn,
                        "records": records,
                        "bare": bare,
                        "bare_failed": bare_failed,
                        "bare_line": bare_line.figures(),
                        "rate": rate,
                        "share": rate / bare,
                        "failed": failed,
                        "line": line.figures(),
                        "load": load,
                    }
                )
                figures = runs[-1]
                bench.report(
                    f"22: {path} turn {turn + 1}: gateway {rate:.1f}/s of the bare {bare:.1f}/s ({rate / bare:.0%}), "
                    f"{failed} failed of {records}; line kept: deferred mean {figures['line']['deferred_mean']:.1f} "
                    f"max {figures['line']['deferred_max']:.0f}, busy slots {figures['line']['processing_mean']:.2f} "
                    f"of {SLOTS} (bare: deferred {figures['bare_line']['deferred_mean']:.1f}, busy "
                    f"{figures['bare_line']['processing_mean']:.2f}); load {load:.1f}"
                )
        worst = {path: min(r["share"] for r in runs if r["path"] == path) for path in PATHS}
        failed = sum(r["failed"] for r in runs)
        bench.rows["llamacpp_flow"] = Row(
            "llamacpp_flow",
            22,
            f"flow control against llama.cpp's llama-server ({SLOTS} slots, {THREADS} thread, {OUTPUT_TOKENS}-token "
            f"answers), max_concurrency {CEILING}, a {REFUSAL_WORKERS}-worker cluster",
            f"worst {worst['latency']:.0%} (latency), {worst['metrics']:.0%} (/metrics) of the bare maximum, "
            f"{failed} failed",
            TARGETS["llamacpp_flow"],
            min(worst.values()) >= 0.95 and failed == 0,
            "; ".join(
                f"{r['path']} {r['turn'] + 1}: {r['rate']:.1f}/s of {r['bare']:.1f}/s ({r['share']:.0%}), "
                f"deferred mean {r['line']['deferred_mean']:.1f} max {r['line']['deferred_max']:.0f}, busy "
                f"{r['line']['processing_mean']:.2f}, load {r['load']:.1f}"
                for r in runs
            )
            + f"; bare: aiohttp holding {BARE_IN_FLIGHT} calls; rates from the first answer to the last; latency = "
            f"the server under {PREFIX} (no /metrics at its root), /metrics = llamacpp:requests_deferred read",
            {"runs": runs},
        )
        bench.report(f"22: {bench.rows['llamacpp_flow'].result}")
