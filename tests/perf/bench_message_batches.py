"""Benchmark: Anthropic Message Batches at Anthropic's limit, and against the same work as chat records
(not collected by pytest).

    .venv/bin/python -m tests.perf.bench_message_batches                      # temp SQLite
    .venv/bin/python -m tests.perf.bench_message_batches --database-url postgres://... --redis-url redis://...

On a throwaway gateway (tests.perf.bench_engine.Stack: database, a no-latency simulator, uvicorn,
a qcluster), it measures:

1. **create at 100,000**: one `POST /v1/messages/batches` of `--records` requests (100,000) of
   `--request-bytes` each: the answer's time and the web process's peak RSS growth;
2. **run and finalize at 100,000**: the batch run to `ended` by the cluster on the simulator, its
   finalize (the result files, from finalizing to the end) and streaming its results JSONL;
3. **e2e against chat**: `--e2e-records` records as an OpenAI chat batch and as a Message Batch
   (translated to chat completions, and passed through to `/v1/messages`), taking turns
   `--rounds` times on one warm cluster: records a second from the first record's start to the
   last record's end. The goal: Messages within 5% of chat.
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson

from tests.perf.bench_engine import Stack
from tests.perf.common import PeakTreeRss

MB = 2**20
UPSTREAM = "sim-upstream"
CHAT_MODEL, MESSAGES_MODEL, NATIVE_MODEL = "bench/chat", "bench/messages", "bench/native"
CONCURRENCY = 64
TARGETS = {"create": "answers, RSS reported", "finalize": "< 10 s at 100,000", "e2e": "Messages >= 0.95x chat"}


def _filler(size):
    return ("lorem ipsum dolor sit amet " * (size // 27 + 1))[:size]


def message_requests(count, model, request_bytes, prefix="m"):
    filler = _filler(max(10, request_bytes - 150))
    return [
        {
            "custom_id": f"{prefix}-{i}",
            "params": {"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": f"{i} {filler}"}]},
        }
        for i in range(count)
    ]


def chat_lines(count, model, request_bytes):
    filler = _filler(max(10, request_bytes - 150))
    return b"".join(
        orjson.dumps(
            {
                "custom_id": f"c-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": f"{i} {filler}"}]},
            }
        )
        + b"\n"
        for i in range(count)
    )


class Run:
    def __init__(self, stack, report):
        self.stack, self.report = stack, report

    def setup(self):
        s = self.stack
        s.manage("migrate", "--noinput", "-v", "0")
        sim = s.start_simulator(0) + "/v1"
        script = [
            "from django.core.management import call_command",
            "from openrelay.core.models import ApiKey, Organization",
            "org = Organization.objects.create(name='bench')",
        ]
        for name, api in ((CHAT_MODEL, "translate"), (MESSAGES_MODEL, "translate"), (NATIVE_MODEL, "native")):
            script.append(
                f"call_command('set_model', {name!r}, base_url={sim!r}, upstream_model={UPSTREAM!r}, "
                f"concurrency={CONCURRENCY}, messages_api={api!r}, input_price='0.20', output_price='0.80', "
                "stdout=open('/dev/null', 'w'))"
            )
        script.append("print(ApiKey.issue(org, name='bench')[1])")
        key = s.manage("shell", "-c", "\n".join(script))[-1]
        base = s.start_web()
        self.http = httpx.Client(
            base_url=base, headers={"x-api-key": key, "Authorization": f"Bearer {key}"}, timeout=900
        )

    def create_messages(self, requests):
        body = orjson.dumps({"requests": requests})
        started = time.perf_counter()
        response = self.http.post("/v1/messages/batches", content=body, headers={"content-type": "application/json"})
        took = time.perf_counter() - started
        response.raise_for_status()
        return response.json()["id"].replace("msgbatch_", "batch_"), took, len(body)

    def create_chat(self, content):
        upload = self.http.post("/v1/files", files={"file": ("c.jsonl", content)}, data={"purpose": "batch"})
        upload.raise_for_status()
        response = self.http.post(
            "/v1/batches",
            json={"input_file_id": upload.json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"},
        )
        response.raise_for_status()
        return response.json()["id"]

    def wait_ended(self, public_id, timeout_s):
        deadline = time.monotonic() + timeout_s
        while (row := self.stack.db.batch(public_id))["status"] not in ("completed", "failed", "expired", "cancelled"):
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{public_id} still {row['status']} ({row['done']}/{row['total']}) after {timeout_s} s"
                )
            time.sleep(0.05)
        return row

    def rate(self, public_id):
        """Records a second from the first record's start (in_progress) to the last record's end."""
        row = self.stack.db.batch(public_id)
        (last,) = self.stack.db.query("SELECT MAX(finished_at) FROM batches_record WHERE batch_id = %s", (row["pk"],))[
            0
        ]
        from tests.perf.bench_engine import _epoch

        return row["total"] / max(1e-6, _epoch(last) - row["in_progress_at"])

    def at_the_limit(self, records, request_bytes):
        requests = message_requests(records, MESSAGES_MODEL, request_bytes)
        with PeakTreeRss(self.stack.web.pid) as rss:
            public_id, took, size = self.create_messages(requests)
        del requests
        self.report(
            f"create  {records:,} requests, {size / MB:.0f} MB body: {took:.2f} s, web RSS +{rss.growth_mb:.0f} MB "
            f"(peak {rss.largest_mb:.0f} MB)"
        )
        cluster = self.stack.start_cluster(2)
        started = time.perf_counter()
        row = self.wait_ended(public_id, 3600)
        self.report(
            f"run     {row['completed']:,} succeeded of {row['total']:,} in {time.perf_counter() - started:.1f} s "
            f"with 2 workers; finalize {row['completed_at'] - row['finalizing_at']:.2f} s"
        )
        started, size = time.perf_counter(), 0
        message_batch_id = public_id.replace("batch_", "msgbatch_")
        with self.http.stream("GET", f"/v1/messages/batches/{message_batch_id}/results") as response:
            response.raise_for_status()
            for chunk in response.iter_bytes():
                size += len(chunk)
        self.report(f"results {size / MB:.0f} MB of JSONL streamed in {time.perf_counter() - started:.2f} s")
        return cluster

    def against_chat(self, records, request_bytes, rounds):
        chat = chat_lines(records, CHAT_MODEL, request_bytes)
        rates = {"chat": [], "messages (translated)": [], "messages (native)": []}
        for n in range(rounds):
            public_id = self.create_chat(chat)
            self.wait_ended(public_id, 1800)
            rates["chat"].append(self.rate(public_id))
            for label, model in (("messages (translated)", MESSAGES_MODEL), ("messages (native)", NATIVE_MODEL)):
                public_id, _, _ = self.create_messages(message_requests(records, model, request_bytes, prefix=f"r{n}"))
                self.wait_ended(public_id, 1800)
                rates[label].append(self.rate(public_id))
        chat_rate = statistics.median(rates["chat"])
        for label, values in rates.items():
            median = statistics.median(values)
            self.report(
                f"e2e     {label:<22} {records:,} records: {median:,.0f} rec/s (median of {rounds}: "
                f"{', '.join(f'{v:,.0f}' for v in values)}), {median / chat_rate:.3f}x chat"
            )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--request-bytes", type=int, default=1_000)
    parser.add_argument("--e2e-records", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--database-url")
    parser.add_argument("--redis-url")
    parser.add_argument("--skip-limit", action="store_true", help="only the e2e comparison")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-messages-") as tmp:
        stack = Stack(Path(tmp), args.database_url, args.redis_url)
        try:
            run = Run(stack, print)
            run.setup()
            print(f"Message Batches on {stack.db.vendor}{' + Redis' if stack.redis else ''}; targets: {TARGETS}")
            if args.skip_limit:
                stack.start_cluster(2)
            else:
                run.at_the_limit(args.records, args.request_bytes)
            run.against_chat(args.e2e_records, args.request_bytes, args.rounds)
        finally:
            stack.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
