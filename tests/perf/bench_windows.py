"""The bench's windows row (21: issue 52): `manage.py bench --only windows`.

Completion windows under load, as issue 52 measures deadline-first scheduling: a model of 80
calls/s (500 ms calls, max_concurrency 40) on the default 2-worker cluster; organizations A and B
each queue 3,000 records (three 1,000-record batches; --quick: 3 x 100) on the 24 h window, and
2 s later organization C creates three 500-record batches (--quick: 3 x 50) on a 60 s window,
one a second. An even third of the model would take C's records ~56 s; deadline-first must give
C what it needs while A and B keep progressing.

Published per window, from each batch object's `openrelay.time_to_first_result` and
`time_to_complete` (batches.latency): p50 / p90 of both, and the deadlines met (completed by
expires_at) over the batches. The web process and the cluster of this row offer the windows
"60s:0.8,24h:0.5" (OPENRELAY_COMPLETION_WINDOWS); the other rows' web keeps the default.
"""

import math
import time

WINDOWS = "60s:0.8,24h:0.5"
SHORT, LONG = "60s", "24h"
MODEL = "bench/lat500"  # bench_engine.MODEL_500
CALLS_PER_S = 80
CONCURRENCY = 40  # 500 ms calls: 80 a second
BATCHES_EACH = 3
C_AFTER_S = 2.0


def percentile(values, q):
    """The nearest-rank q-th percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


class WindowRuns:
    def __init__(self, bench):
        self.bench = bench
        quick = bench.scale.quick
        self.backlog, self.short = (100, 50) if quick else (1_000, 500)

    def run(self):
        from tests.perf.bench_engine import LATENCY_CONCURRENCY, TARGETS, Row

        bench, stack = self.bench, self.bench.stack
        bench.release_shared()
        api_a, api_b, api_c = self._clients()
        files = {
            "a": bench.file("win-a.jsonl", self.backlog, MODEL, api=api_a)[1],
            "b": bench.file("win-b.jsonl", self.backlog, MODEL, api=api_b)[1],
            "c": bench.file("win-c.jsonl", self.short, MODEL, api=api_c)[1],
        }
        bench.set_concurrency(MODEL, CONCURRENCY)
        cluster = stack.start_cluster(2, OPENRELAY_COMPLETION_WINDOWS=WINDOWS)
        try:
            batches = self._create(api_a, api_b, api_c, files)
            figures = self._wait_and_read(api_a, api_b, api_c, batches)
        finally:
            stack.stop_cluster(cluster)
            stack.stop(self.web)
            bench.set_concurrency(MODEL, LATENCY_CONCURRENCY)
        by_window = {window: self._summary(figures[window]) for window in (SHORT, LONG)}
        short, long = by_window[SHORT], by_window[LONG]
        bench.rows["windows"] = Row(
            "windows",
            21,
            f"windows: org C's {BATCHES_EACH} x {self.short:,} records on {SHORT} behind orgs A and B's "
            f"{2 * BATCHES_EACH} x {self.backlog:,} on {LONG}",
            f"{SHORT}: {short['met']}/{short['total']} met, p90 done {short['complete_p90']:.1f} s; "
            f"{LONG}: {long['met']}/{long['total']} met",
            TARGETS["windows"],
            short["met"] == short["total"] and long["met"] == long["total"],
            "; ".join(self._detail(window, summary) for window, summary in by_window.items())
            + f"; {MODEL} at {CALLS_PER_S} calls/s, 2-worker cluster, C created {C_AFTER_S:.0f} s after A and B",
            by_window,
        )
        bench.report(f"21: windows {by_window}")

    def _clients(self):
        """API clients of organizations A, B and C on a web process of this row's own, which offers WINDOWS."""
        from tests.perf.bench_engine import Api

        bench, stack = self.bench, self.bench.stack
        script = [
            "from openrelay.core.models import ApiKey, Organization",
            "org = Organization.objects.get_or_create(name='bench-c')[0]",
            "print(ApiKey.issue(org, name='bench-c')[1])",
        ]
        key_c = stack.manage("shell", "-c", "\n".join(script))[-1]
        base = stack.start_web(OPENRELAY_COMPLETION_WINDOWS=WINDOWS)
        self.web = stack.web
        return Api(base, bench.key), Api(base, bench.key_b), Api(base, key_c)

    def _create(self, api_a, api_b, api_c, files):
        """{public id: (api, window)}: A's and B's backlog, then C's short-window batches a second apart."""
        batches = {}
        for _ in range(BATCHES_EACH):
            for api, name in ((api_a, "a"), (api_b, "b")):
                batches[api.create(files[name], window=LONG)[0]["id"]] = (api, LONG)
        time.sleep(C_AFTER_S)
        for i in range(BATCHES_EACH):
            if i:
                time.sleep(1.0)
            batches[api_c.create(files["c"], window=SHORT)[0]["id"]] = (api_c, SHORT)
        return batches

    def _wait_and_read(self, api_a, api_b, api_c, batches):
        """{window: [(time to first result, time to complete, deadline met)]} once every batch ended."""
        bench = self.bench
        timeout = 120 + 2 * BATCHES_EACH * self.backlog / CALLS_PER_S
        figures = {SHORT: [], LONG: []}
        for public_id, (api, window) in batches.items():
            bench.wait_done(public_id, timeout)
            shown = api.client.get(f"/batches/{public_id}").raise_for_status().json()
            met = shown["status"] == "completed" and shown["completed_at"] <= shown["expires_at"]
            latency = shown["openrelay"]
            figures[window].append((latency["time_to_first_result"], latency["time_to_complete"], met))
        return figures

    @staticmethod
    def _summary(rows):
        first = [f for f, _, _ in rows if f is not None]
        complete = [c for _, c, _ in rows if c is not None]
        return {
            "total": len(rows),
            "met": sum(met for _, _, met in rows),
            "first_result_p50": percentile(first, 50) if first else math.nan,
            "first_result_p90": percentile(first, 90) if first else math.nan,
            "complete_p50": percentile(complete, 50) if complete else math.nan,
            "complete_p90": percentile(complete, 90) if complete else math.nan,
        }

    @staticmethod
    def _detail(window, s):
        return (
            f"{window}: first result p50 {s['first_result_p50']:.1f} s / p90 {s['first_result_p90']:.1f} s, "
            f"complete p50 {s['complete_p50']:.1f} s / p90 {s['complete_p90']:.1f} s, "
            f"deadlines met {s['met']}/{s['total']}"
        )
