"""The bench's reuse row (19: issue 53): `manage.py bench --only reuse`.

The big batch's record count (50,000; --quick 500), half of them duplicates (every
deterministic request twice), run with `openrelay.reuse` "auto" and "off" in turn:
model calls (records that ran: the total less the reused lines), billed tokens and their
cost at the batch's prices, and the time from create's answer to completed.
"""

import time

import orjson

ENDPOINT = "/v1/chat/completions"
MODEL = "bench/zero"  # bench_engine.MODEL_ZERO: the 0 ms model


def write_duplicated_input(path, records, model):
    """`records` lines, each deterministic body twice (custom_ids differ): 50% duplicates."""
    with open(path, "wb") as out:
        for i in range(records):
            body = {
                "model": model,
                "temperature": 0,
                "max_tokens": 16,
                "messages": [{"role": "user", "content": f"Question {i // 2}: what is reused?"}],
            }
            out.write(orjson.dumps({"custom_id": f"req-{i:06d}", "method": "POST", "url": ENDPOINT, "body": body}))
            out.write(b"\n")


class ReuseRuns:
    def __init__(self, bench):
        self.bench = bench

    def run(self):
        from tests.perf.bench_engine import TARGETS, Row

        bench, records = self.bench, self.bench.scale.big
        path = bench.tmp / "reuse.jsonl"
        write_duplicated_input(path, records, MODEL)
        file_id, _ = bench.api.upload(path)
        bench.shared_cluster()
        off, auto = self._run(file_id, "off", records), self._run(file_id, "auto", records)
        calls_ratio = auto["calls"] / off["calls"]
        ok = auto["calls"] == records // 2 and off["calls"] == records and auto["lines"] == records
        bench.rows["reuse"] = Row(
            "reuse",
            19,
            f"reuse: {records:,} records, 50% duplicates (deterministic), reuse auto vs off",
            f"{calls_ratio:.2f}x the calls, {auto['seconds'] / off['seconds']:.2f}x the time",
            TARGETS["reuse"],
            ok,
            f"calls {auto['calls']:,} vs {off['calls']:,}; billed tokens {auto['tokens']:,} vs {off['tokens']:,} "
            f"(${auto['cost']:.4f} vs ${off['cost']:.4f}); {auto['seconds']:.1f} s vs {off['seconds']:.1f} s "
            f"create -> completed; every line under its own custom_id: {auto['lines'] == records}",
            {"auto": auto, "off": off},
        )
        bench.report(
            f"19: reuse {auto['calls']} calls vs {off['calls']}; {auto['seconds']:.1f} s vs {off['seconds']:.1f} s"
        )

    def _run(self, file_id, mode, records):
        bench = self.bench
        sent = time.time()
        response = bench.api.client.post(
            "/batches",
            json={
                "input_file_id": file_id,
                "endpoint": ENDPOINT,
                "completion_window": "24h",
                "openrelay": {"reuse": mode},
            },
        )
        response.raise_for_status()
        row = bench.wait_done(response.json()["id"], bench._deadline(records, 200))
        assert row["completed"] == records, row
        (reused, tokens, cost, lines) = bench.stack.db.query(
            "SELECT b.reused_count, b.input_tokens + b.output_tokens, "
            "(b.input_tokens * b.price_input + b.output_tokens * b.price_output) * b.price_multiplier / 1000000, "
            "(SELECT COUNT(DISTINCT custom_id) FROM batches_record WHERE batch_id = b.id AND status = 'succeeded') "
            "FROM batches_batch AS b WHERE b.id = %s",
            (row["pk"],),
        )[0]
        return {
            "calls": records - reused,
            "tokens": int(tokens),
            "cost": float(cost),
            "lines": lines,
            "seconds": row["completed_at"] - sent,
        }
