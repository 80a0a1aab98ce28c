"""The bench's flow-control rows (12-14, 18): adaptive concurrency and prefix-aware dispatch, against the
simulator's capacity model (openrelay.simulator: N decode slots, a queue, a prefix cache).

Each run starts its own simulator with the shape below, registers a model on it through the bench's
database, runs one batch through a fresh cluster and reads the simulator's own figures
(`GET /_sim/stats`: requests completed, 503s from its queue limit, cached prompt tokens).
"""

import asyncio
import random
import signal
import threading
import time

import httpx
import orjson

from openrelay.simulator.answers import count_tokens
from openrelay.simulator.capacity import capacity_per_second
from openrelay.simulator.config import SimulatorConfig

SLOTS = 16
QUEUE_LIMIT = 16  # past 16 waiting, the server answers 503 (with Retry-After)
PREFILL_MS, DECODE_MS, CONTENTION = 0.02, 2.0, 0.5
OUTPUT_TOKENS = 32
TOO_HIGH = 8 * SLOTS  # row 12: max_concurrency 8x what the server can run
LOW_CEILING, LOW_START = 2 * SLOTS, SLOTS // 4  # row 13: a ceiling above the slots, starting 4x below them
FLOW_SECONDS = 30  # each flow run's length at the server's capacity
# Row 14: 20 system prompts shuffled through the batch; the server's prefix cache holds four of them.
PREFIX_PROMPTS, PREFIX_PROMPT_TOKENS, PREFIX_CACHE_PROMPTS = 20, 1_000, 4
PREFIX_PREFILL_MS, PREFIX_OUTPUT_TOKENS = 0.05, 16
# Row 18 (issue 55): refusals at the defaults. max_concurrency far above three 16-slot servers (no queue,
# a queue as long as its slots, 4x that), one cluster of two workers and two of them; each run before
# (the rules: no line, no learned ceiling, the start per engine) beside after, in turn.
REFUSAL_QUEUES = (("no queue", 0), ("queue = slots", SLOTS), ("queue 4x slots", 4 * SLOTS))
REFUSAL_PATHS = ("", "vllm")  # the latency rules alone; the server's /metrics read
REFUSAL_CLUSTERS = (1, 2)
REFUSAL_WHENS = ("before", "after")
REFUSAL_CEILING = 256
REFUSAL_SECONDS = 30  # row 12's length
REFUSAL_SETTLED_S = 5.0  # 503s after this long are the steady state's, not slow start's probe
REFUSAL_WORKERS = 2  # OPENRELAY_Q_WORKERS' default: a cluster is two engines
DEFAULT_START = 16  # OPENRELAY_CONCURRENCY_START's default


def refusal_terms(queue, metrics, clusters, when):
    """The terms `manage.py bench --refusals` names one of row 18's runs by: server, path, clusters, when."""
    return (f"q{queue}", metrics or "latency", f"{clusters}c", when)


def refusal_runs(terms=()):
    """Row 18's runs that `terms` name, as (server, queue, metrics, clusters, when), in the row's order.

    Terms of one kind are alternatives (q0 q16: either server), kinds narrow each other (q0 2c: the
    server without a queue on two clusters); a kind no term names keeps all its values."""
    every = [
        (server, queue, metrics, clusters, when)
        for server, queue in REFUSAL_QUEUES
        for metrics in REFUSAL_PATHS
        for clusters in REFUSAL_CLUSTERS
        for when in REFUSAL_WHENS
    ]
    kinds = [set(values) for values in zip(*(refusal_terms(*run[1:]) for run in every))]
    terms = set(terms)
    unknown = terms - set().union(*kinds)
    if unknown:
        raise ValueError(f"--refusals takes {' '.join(sorted(set().union(*kinds)))}; not {' '.join(sorted(unknown))}")
    wanted = [kind & terms or kind for kind in kinds]
    return [run for run in every if all(t in w for t, w in zip(refusal_terms(*run[1:]), wanted))]


def before_env(clusters):
    """The engines as issue 55 measured them: no line (latency tolerance alone), no learned ceiling, and
    the start taken by every engine (here: the default start times the engines, split over them)."""
    return {
        "OPENRELAY_QUEUE_LINE": "0",
        "OPENRELAY_CEILING_HOLD_S": "0",
        "OPENRELAY_CONCURRENCY_START": str(DEFAULT_START * REFUSAL_WORKERS * clusters),
    }


def _flow_config(**kw):
    return SimulatorConfig(
        slots=SLOTS,
        queue_limit=QUEUE_LIMIT,
        prefill_ms_per_token=PREFILL_MS,
        decode_ms_per_token=DECODE_MS,
        decode_contention=CONTENTION,
        **kw,
    )


def _argv(config, metrics=""):
    argv = [
        "--slots",
        str(config.slots),
        "--prefill-ms-per-token",
        str(config.prefill_ms_per_token),
        "--decode-ms-per-token",
        str(config.decode_ms_per_token),
        "--decode-contention",
        str(config.decode_contention),
    ]
    if config.queue_limit is not None:
        argv += ["--queue-limit", str(config.queue_limit)]
    if config.prefix_cache_tokens:
        argv += ["--prefix-cache-tokens", str(config.prefix_cache_tokens)]
    if metrics:
        argv += ["--metrics", metrics]
    return argv


def _write(path, bodies, model):
    with open(path, "wb") as out:
        for i, body in enumerate(bodies, 1):
            out.write(
                orjson.dumps(
                    {
                        "custom_id": f"r{i}",
                        "method": "POST",
                        "url": "/v1/chat/completions",
                        "body": {"model": model, **body},
                    }
                )
                + b"\n"
            )


def _stats(url):
    return httpx.get(f"{url}/_sim/stats", timeout=10).json()


def server_maximum(url, bodies, model, in_flight=SLOTS + QUEUE_LIMIT // 2):
    """The server's real maximum rate: a bare client keeping every slot busy and a short line
    waiting (never past the queue limit), records / elapsed. The capacity formula leaves out the
    simulator's own overheads (its handler, timers, HTTP), about 10% here."""

    async def go():
        import aiohttp  # the bare client of the end-to-end row: httpx's async pool costs more CPU than the server

        todo = iter(bodies)
        async with aiohttp.ClientSession(base_url=url, connector=aiohttp.TCPConnector(limit=in_flight)) as client:

            async def worker():
                for body in todo:
                    async with client.post("/v1/chat/completions", json={"model": model, **body}) as answer:
                        answer.raise_for_status()
                        await answer.read()

            started = time.monotonic()
            await asyncio.gather(*(worker() for _ in range(in_flight)))
            return len(bodies) / (time.monotonic() - started)

    rate = asyncio.run(go())
    httpx.post(f"{url}/_sim/reset", timeout=10)
    return rate


class FlowRuns:
    """Rows 12-14, given the bench (its stack, API client, rows and reporting)."""

    def __init__(self, bench):
        self.bench = bench
        self.stack = bench.stack

    def _model(self, name, url, concurrency):
        self.stack.manage(
            "set_model",
            name,
            "--base-url",
            url + "/v1",
            "--upstream-model",
            "sim",
            "--concurrency",
            str(concurrency),
            "--input-price",
            "0.20",
            "--output-price",
            "0.80",
        )

    def _run(self, name, url, concurrency, bodies, timeout_s, sample=None, clusters=1, **cluster_env):
        """One batch of `bodies` on `clusters` fresh 2-worker clusters; (seconds from create's answer to
        completed, batch row)."""
        bench = self.bench
        bench.release_shared()  # a cluster another run left up would share the batch (and outlive this one's stop)
        self._model(name, url, concurrency)
        path = bench.tmp / f"{name.replace('/', '-')}.jsonl"
        _write(path, bodies, name)
        file_id, _ = bench.api.upload(path)
        started = []
        try:
            for _ in range(clusters):
                started.append(self.stack.start_cluster(REFUSAL_WORKERS, **cluster_env))
            httpx.post(f"{url}/_sim/reset", timeout=10)
            batch, _, answered = bench.api.create(file_id)
            if sample is not None:
                sample(batch["id"], answered)
            row = bench.wait_done(batch["id"], timeout_s)
        finally:
            for cluster in started:  # all at once: stop_cluster waits until no engine at all is live
                if cluster.poll() is None:
                    cluster.send_signal(signal.SIGTERM)
            for cluster in started:
                self.stack.stop_cluster(cluster)
        return row["completed_at"] - answered, batch["id"], row

    def finishing_rate(self, public_id, records):
        """Records a second from the batch's first finished record to its last (create and finalize left out,
        as the bare client has neither)."""
        first, last = self.stack.db.query(
            "SELECT MIN(r.finished_at), MAX(r.finished_at) FROM batches_record r JOIN batches_batch b "
            "ON r.batch_id = b.id WHERE b.public_id = %s",
            (public_id,),
        )[0]
        from tests.perf.bench_engine import _epoch

        return records / max(1e-6, _epoch(last) - _epoch(first))

    # 12: max_concurrency 8x too high
    def too_high(self):
        bench = self.bench
        prompt = f"Summarise the ticket. [[tokens:{OUTPUT_TOKENS}]]"
        capacity = capacity_per_second(_flow_config(), count_tokens(prompt), OUTPUT_TOKENS)
        records = max(200, int(capacity * (5 if bench.scale.quick else FLOW_SECONDS)))
        results = {}
        for metrics in ("", "vllm"):
            url = self.stack.start_simulator(0, extra=_argv(_flow_config(), metrics), name=f"flow-high{metrics}")
            bodies = [{"messages": [{"role": "user", "content": f"{prompt} #{i}"}]} for i in range(records)]
            maximum = server_maximum(url, bodies[: max(200, records // 3)], "sim")
            _, public_id, _ = self._run(
                f"bench/flow-high{metrics or '-latency'}", url, TOO_HIGH, bodies, 120 + 4 * records / capacity
            )
            rate = self.finishing_rate(public_id, records)
            stats = _stats(url)
            calls = stats["completed"] + stats["rejected"]
            results[metrics or "latency"] = (
                rate / maximum,
                stats["rejected"] / max(1, calls),
                stats["max_waiting"],
                stats["rejected"],
                calls,
                rate,
                maximum,
            )
        worst_share = min(r[0] for r in results.values())
        worst_503 = max(r[1] for r in results.values())
        from tests.perf.bench_engine import TARGETS, Row

        bench.rows["flow_high"] = Row(
            "flow_high",
            12,
            f"max_concurrency 8x too high ({TOO_HIGH} on {SLOTS} slots), {records:,} records",
            f"{worst_share:.0%} of max, {worst_503:.2%} 503s",
            TARGETS["flow_high"],
            worst_share >= 0.95 and worst_503 <= 0.01,
            "; ".join(
                f"{how}: {rate:.0f}/s of the server's {maximum:.0f}/s ({share:.0%}), {rejected} 503s of {calls} "
                f"calls, at most {waiting} waiting"
                for how, (share, _, waiting, rejected, calls, rate, maximum) in results.items()
            )
            + f"; the server's maximum: a bare client holding {SLOTS + QUEUE_LIMIT // 2} calls (the formula says "
            f"{capacity:.0f}/s); the gateway's rate: first to last finished record; server: {SLOTS} slots, queue "
            f"limit {QUEUE_LIMIT}, {DECODE_MS} ms a token (contention {CONTENTION}), {OUTPUT_TOKENS} tokens an "
            f"answer; latency = no /metrics, vllm = the server's /metrics read",
            {
                how: {"share": r[0], "rejected_share": r[1], "max_waiting": r[2], "rate": r[5], "maximum": r[6]}
                for how, r in results.items()
            },
        )
        bench.report(f"12: {bench.rows['flow_high'].result} ({bench.rows['flow_high'].detail})")

    # 13: the ceiling right, the start 4x too low
    def too_low(self):
        bench = self.bench
        prompt = f"Classify the review. [[tokens:{OUTPUT_TOKENS}]]"
        capacity = capacity_per_second(_flow_config(), count_tokens(prompt), OUTPUT_TOKENS)
        records = max(200, int(capacity * (8 if bench.scale.quick else FLOW_SECONDS + 10)))
        url = self.stack.start_simulator(0, extra=_argv(_flow_config()), name="flow-low")
        bodies = [{"messages": [{"role": "user", "content": f"{prompt} #{i}"}]} for i in range(records)]
        capacity = server_maximum(url, bodies[: max(200, records // 4)], "sim")
        reached = {}

        def sample(public_id, answered):
            # Finished records every 0.5 s from the database: when does the rate over 2 s reach 90%?
            marks = []
            deadline = answered + 120 + 2 * records / capacity
            while time.time() < deadline:
                row = self.stack.db.batch(public_id)
                done = row["completed"] + row["failed"]
                marks.append((time.time(), done))
                window = [m for m in marks if m[0] >= marks[-1][0] - 2.0]
                if len(window) >= 4 and window[-1][0] > window[0][0]:
                    rate = (window[-1][1] - window[0][1]) / (window[-1][0] - window[0][0])
                    if rate >= 0.9 * capacity:
                        reached["s"] = window[-1][0] - answered
                        return
                if done >= records:
                    return
                time.sleep(0.5)

        self._run(
            "bench/flow-low",
            url,
            LOW_CEILING,
            bodies,
            120 + 4 * records / capacity,
            sample=sample,
            OPENRELAY_CONCURRENCY_START=str(LOW_START // 2),
        )  # two engines: 2 each, 4 in all
        took = reached.get("s")
        from tests.perf.bench_engine import TARGETS, Row

        bench.rows["flow_low"] = Row(
            "flow_low",
            13,
            f"start 4x too low ({LOW_START} of {SLOTS} slots, ceiling {LOW_CEILING}), {records:,} records",
            "never" if took is None else f"{took:.1f} s",
            TARGETS["flow_low"],
            took is not None and took <= 30,
            f"create's answer -> finished records' rate over 2 s >= 90% of {capacity:.0f}/s (the server's maximum, "
            f"measured with a bare client holding {SLOTS + QUEUE_LIMIT // 2} calls)",
            {"seconds_to_90": took, "capacity": capacity},
        )
        bench.report(f"13: {bench.rows['flow_low'].result}")

    # 14: prefix-aware dispatch against file order
    def prefix_aware(self):
        bench = self.bench
        records = 1_000 if bench.scale.quick else 10_000
        rng = random.Random(14)
        prompts = [
            f"System prompt {p}: " + " ".join(f"rule{p}-{i}" for i in range(PREFIX_PROMPT_TOKENS // 2))
            for p in range(PREFIX_PROMPTS)
        ]
        tokens = count_tokens(prompts[0])
        config = SimulatorConfig(
            slots=SLOTS,
            prefill_ms_per_token=PREFIX_PREFILL_MS,
            decode_ms_per_token=DECODE_MS,
            decode_contention=CONTENTION,
            prefix_cache_tokens=PREFIX_CACHE_PROMPTS * tokens,
        )
        bodies = [
            {
                "messages": [
                    {"role": "system", "content": rng.choice(prompts)},
                    {"role": "user", "content": f"Question {i} [[tokens:{PREFIX_OUTPUT_TOKENS}]]"},
                ]
            }
            for i in range(records)
        ]
        worst_rate = capacity_per_second(config, tokens, PREFIX_OUTPUT_TOKENS)
        results = {}
        for how, size in (("file order", "0"), ("prefix-aware", "1024")):
            url = self.stack.start_simulator(0, extra=_argv(config), name=f"prefix-{size}")
            seconds, _, row = self._run(
                f"bench/prefix-{size}", url, SLOTS, bodies, 120 + 3 * records / worst_rate, OPENRELAY_PREFIX_BYTES=size
            )
            stats = _stats(url)
            results[how] = (seconds, stats["cached_tokens"] / max(1, stats["prompt_tokens"]))
            bench.report(f"14: {how}: {seconds:.1f} s, cached share {results[how][1]:.1%}")
        (plain_s, plain_share), (aware_s, aware_share) = results["file order"], results["prefix-aware"]
        faster, more = plain_s / aware_s, aware_share / max(plain_share, 1e-9)
        from tests.perf.bench_engine import TARGETS, Row

        bench.rows["prefix"] = Row(
            "prefix",
            14,
            f"{PREFIX_PROMPTS} system prompts shuffled through {records:,} records",
            f"{faster:.2f}x faster, {more:.1f}x cached share",
            TARGETS["prefix"],
            faster >= 1.5 and more >= 3,
            f"file order {plain_s:.1f} s, {plain_share:.1%} cached; prefix-aware {aware_s:.1f} s, {aware_share:.1%} "
            f"cached; ~{tokens} tokens a system prompt, prefix cache of {PREFIX_CACHE_PROMPTS} prompts, "
            f"{SLOTS} slots, {PREFIX_PREFILL_MS} ms a prompt token, {DECODE_MS} ms an output token",
            {
                "file_order": {"seconds": plain_s, "cached_share": plain_share},
                "prefix_aware": {"seconds": aware_s, "cached_share": aware_share},
            },
        )

    # 18: refusals at the defaults (issue 55)
    def refusals(self):
        """Each server x each path (latency, vLLM /metrics) x one and two clusters: before beside after."""
        bench = self.bench
        prompt = f"Summarise the ticket. [[tokens:{OUTPUT_TOKENS}]]"
        capacity = capacity_per_second(_flow_config(), count_tokens(prompt), OUTPUT_TOKENS)
        records = max(200, int(capacity * (4 if bench.scale.quick else REFUSAL_SECONDS)))
        bodies = [{"messages": [{"role": "user", "content": f"{prompt} #{i}"}]} for i in range(records)]
        runs = {}  # (server, path, clusters, "before"/"after") -> figures
        urls = {}  # (queue, metrics) -> (the simulator's url, the server's maximum)
        for server, queue, metrics, clusters, when in refusal_runs(bench.scale.refusals):
            if (queue, metrics) not in urls:
                config = SimulatorConfig(
                    slots=SLOTS,
                    queue_limit=queue,
                    prefill_ms_per_token=PREFILL_MS,
                    decode_ms_per_token=DECODE_MS,
                    decode_contention=CONTENTION,
                )
                url = self.stack.start_simulator(0, extra=_argv(config, metrics), name=f"refuse-q{queue}{metrics}")
                maximum = server_maximum(url, bodies[: max(200, records // 3)], "sim", SLOTS + queue // 2)
                urls[(queue, metrics)] = (url, maximum)
            url, maximum = urls[(queue, metrics)]
            name, path = f"refuse-q{queue}{metrics}", metrics or "latency"
            env = before_env(clusters) if when == "before" else {}
            early = {}

            def sample(public_id, answered, url=url, early=early):
                # The server's 503s once slow start is over: read in a thread, as _run waits.
                def read():
                    time.sleep(max(0.0, answered + REFUSAL_SETTLED_S - time.time()))
                    early["rejected"] = _stats(url)["rejected"]

                early["thread"] = threading.Thread(target=read, daemon=True)
                early["thread"].start()

            _, public_id, row = self._run(
                f"bench/{name}-{clusters}-{when}",
                url,
                REFUSAL_CEILING,
                bodies,
                120 + 4 * records / capacity,
                sample=sample,
                clusters=clusters,
                **env,
            )
            early["thread"].join()
            stats = _stats(url)
            calls = stats["completed"] + stats["rejected"]
            rate = self.finishing_rate(public_id, records)
            runs[(server, path, clusters, when)] = {
                "share": rate / maximum,
                "rejected_share": stats["rejected"] / max(1, calls),
                "rejected": stats["rejected"],
                "rejected_settled": stats["rejected"] - early.get("rejected", 0),
                "calls": calls,
                "max_waiting": stats["max_waiting"],
                "rate": rate,
                "maximum": maximum,
                "failed": row["failed"],
            }
            bench.report(
                f"18: {server}, {path}, {clusters} cluster(s), {when}: {rate:.0f}/s of {maximum:.0f}/s "
                f"({rate / maximum:.0%}), {stats['rejected']} 503s of {calls} "
                f"({stats['rejected'] / max(1, calls):.2%}; "
                f"{stats['rejected'] - early.get('rejected', 0)} after the first {REFUSAL_SETTLED_S:.0f} s), "
                f"at most {stats['max_waiting']} waiting"
            )
        after = [r for key, r in runs.items() if key[3] == "after"] or [{"share": 0, "rejected_share": 1}]
        before = [r for key, r in runs.items() if key[3] == "before"] or [{"share": 0, "rejected_share": 1}]
        worst_share = min(r["share"] for r in after)
        worst_503 = max(r["rejected_share"] for r in after)
        from tests.perf.bench_engine import TARGETS, Row

        bench.rows["flow_refusals"] = Row(
            "flow_refusals",
            18,
            f"refusals at the defaults: 3 servers of {SLOTS} slots (queue 0, {SLOTS}, {4 * SLOTS}), "
            f"max_concurrency {REFUSAL_CEILING}, 1 and 2 clusters of {REFUSAL_WORKERS} workers, {records:,} records",
            f"after: worst {worst_share:.0%} of max, {worst_503:.2%} 503s; before: worst "
            f"{min(r['share'] for r in before):.0%}, {max(r['rejected_share'] for r in before):.2%}",
            TARGETS["flow_refusals"],
            worst_share >= 0.95
            and worst_503 <= 0.003
            and not any(r.get("failed") for r in after)
            and not bench.scale.refusals,  # a part of the row passes nothing
            "; ".join(
                f"{server}/{path}/{clusters}c: "
                + ", ".join(
                    f"{when} {r['share']:.0%} {r['rejected_share']:.2%} ({r['rejected_settled']} after "
                    f"{REFUSAL_SETTLED_S:.0f} s)"
                    for when in REFUSAL_WHENS
                    if (r := runs.get((server, path, clusters, when)))
                )
                for server, path, clusters in dict.fromkeys(key[:3] for key in runs)
            )
            + f"; share: the rate (first to last finished record) over the server's maximum (a bare client "
            f"holding its slots and half its queue); 503s of all calls; the before runs: "
            f"OPENRELAY_QUEUE_LINE=0, OPENRELAY_CEILING_HOLD_S=0, the start {DEFAULT_START} an engine",
            {"|".join(map(str, key)): figures for key, figures in runs.items()},
        )
        bench.report(f"18: {bench.rows['flow_refusals'].result}")
