"""The quote's benchmark rows (issue 41), run by tests/perf/bench_engine.py as the part `estimate`.

    .venv/bin/python manage.py bench --only estimate [--quick]

On a capacity-limited simulator (8 slots, 2 ms a decoded token, 0.02 ms a
prefilled one, vLLM's /tokenize) registered as CAPACITY_MODEL with prices:
- history: organization A runs a small batch of the same shape first;
- organization B's batch is already running when A asks for a quote of its
  own batch (5,000 records; 500 with --quick), then creates it at once:
  the quote's input tokens (±3%), expected cost (±15%) and expected
  duration (±25%, create's answer -> completed) against what the run reports;
- a case built to miss: a web process whose window is half the quoted
  duration quotes fits_window false for that batch and true for a small
  one; created, the first expires unfinished and the second completes;
- the quote of a 50,000-record ~200 MB file over HTTP (no cluster
  running), against create on the same file: time and the web process's
  peak RSS growth, each on a fresh web process.
"""

import time

from tests.perf.common import MB, PeakRss

ROW = 18  # the number of every row this module adds to the bench table
CAPACITY_MODEL = "bench/capacity"
SIM_ARGS = (
    "--slots",
    "8",
    "--decode-ms-per-token",
    "2",
    "--prefill-ms-per-token",
    "0.02",
    "--tokenizer",
    "vllm",
)
CONCURRENCY = 16  # twice the slots: the server, not the gateway, is the bound
PRICES = {"input_price": "0.20", "output_price": "0.80"}
TARGETS = {
    "estimate_tokens": "within ±3%",
    "estimate_cost": "within ±15%",
    "estimate_time": "within ±25%",
    "estimate_window": "false -> expired, true -> completed",
    "estimate_speed": "<= 2x create, RSS like create",
}


def write_shaped(path, records, model, *, line_bytes=300, start=0):
    """Chat lines whose answers vary: 16 to 80 output tokens ([[tokens:N]]), prompts of 1 to 3 x line_bytes/3."""
    import orjson

    filler = "lorem ipsum dolor sit amet " * (2 * line_bytes // 27 + 1)
    with open(path, "wb") as out:
        for i in range(start, start + records):
            size = max(20, line_bytes // 2 * (1 + i % 3) - 180)  # lines of about line_bytes on average
            content = f"[[tokens:{16 + 16 * (i % 5)}]] question {i}: {filler[:size]}"
            body = {"model": model, "max_tokens": 128, "messages": [{"role": "user", "content": content}]}
            out.write(
                orjson.dumps({"custom_id": f"q-{i:06d}", "method": "POST", "url": "/v1/chat/completions", "body": body})
                + b"\n"
            )
    return path.stat().st_size


def quote(api, file_id, window="24h"):
    response = api.client.post(
        "/batches/estimate",
        json={"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": window},
    )
    response.raise_for_status()
    return response.json()


def run_part(bench, Row):
    """Every row of the part, into bench.rows."""
    s, sc = bench.stack, bench.scale
    records = 500 if sc.quick else 5_000
    url = s.start_simulator(0, extra=SIM_ARGS, name="sim-capacity")
    s.manage(
        "set_model",
        CAPACITY_MODEL,
        "--base-url",
        f"{url}/v1",
        "--upstream-model",
        "capacity-upstream",
        "--concurrency",
        str(CONCURRENCY),
        "--input-price",
        PRICES["input_price"],
        "--output-price",
        PRICES["output_price"],
    )
    bench.release_shared()
    cluster = s.start_cluster(2)
    try:
        _accuracy(bench, Row, records)
        _window(bench, Row, records)
    finally:
        s.stop_cluster(cluster)
    _speed(bench, Row)


def _file(bench, name, records, api=None, **kw):
    path = bench.tmp / name
    write_shaped(path, records, CAPACITY_MODEL, **kw)
    file_id, _ = (api or bench.api).upload(path)
    return file_id


def _accuracy(bench, Row, records):
    history = _file(bench, "est-history.jsonl", max(50, records // 25))
    batch, _, _ = bench.api.create(history)
    bench.wait_done(batch["id"], 300)
    theirs = _file(bench, "est-b.jsonl", records, api=bench.api_b, start=10_000)
    mine = _file(bench, "est-a.jsonl", records, start=20_000)
    b_batch, _, _ = bench.api_b.create(theirs)
    _wait_running(bench, b_batch["id"], seconds=2 if bench.scale.quick else 10)
    quoted = quote(bench.api, mine)
    batch, _, answered = bench.api.create(mine)
    row = bench.wait_done(batch["id"], 900)
    bench.wait_done(b_batch["id"], 300)
    actual_s = row["completed_at"] - answered
    final = bench.api.client.get(f"/batches/{batch['id']}").json()
    tokens_err = quoted["input_tokens"]["total"] / final["usage"]["input_tokens"] - 1
    cost_err = float(quoted["cost"]["expected"]) / float(final["openrelay"]["cost"]["total"]) - 1
    time_err = quoted["time"]["expected_duration_s"] / actual_s - 1
    detail = (
        f"{records:,} records on an 8-slot simulator, org B's {records:,} running "
        f"({quoted['time']['queued_ahead']['records']:,} queued ahead)"
    )
    bench.rows["estimate_tokens"] = Row(
        "estimate_tokens",
        ROW,
        "quote: input tokens vs the run",
        f"{tokens_err:+.2%}",
        TARGETS["estimate_tokens"],
        abs(tokens_err) <= 0.03,
        f"{quoted['input_tokens']['total']:,} quoted ({quoted['input_tokens']['method']}, "
        f"{quoted['input_tokens']['counted_records']} counted, ±{quoted['input_tokens']['error_pct']}%) vs "
        f"{final['usage']['input_tokens']:,} reported",
        {"quoted": quoted["input_tokens"], "reported": final["usage"]["input_tokens"]},
    )
    bench.rows["estimate_cost"] = Row(
        "estimate_cost",
        ROW,
        "quote: expected cost vs the bill (with history)",
        f"{cost_err:+.1%}",
        TARGETS["estimate_cost"],
        abs(cost_err) <= 0.15,
        f"{quoted['cost']['expected']} quoted ({quoted['output_tokens']['basis']}, "
        f"{quoted['output_tokens']['history_records']} past records) vs {final['openrelay']['cost']['total']} USD",
        {"quoted": quoted["cost"], "billed": final["openrelay"]["cost"]},
    )
    bench.rows["estimate_time"] = Row(
        "estimate_time",
        ROW,
        "quote: expected duration vs the run",
        f"{time_err:+.1%}",
        TARGETS["estimate_time"],
        abs(time_err) <= 0.25,
        f"{quoted['time']['expected_duration_s']:.1f} s quoted ({quoted['time']['basis']}) vs {actual_s:.1f} s "
        f"create -> completed; {detail}",
        {"quoted_s": quoted["time"]["expected_duration_s"], "actual_s": actual_s, "quote": quoted["time"]},
    )
    bench.report(f"{ROW}: tokens {tokens_err:+.2%}, cost {cost_err:+.1%}, time {time_err:+.1%} ({actual_s:.1f} s)")


def _wait_running(bench, public_id, seconds):
    deadline = time.monotonic() + 120
    while True:
        row = bench.stack.db.batch(public_id)
        if row["in_progress_at"] and time.time() - row["in_progress_at"] >= seconds and row["done"]:
            assert row["done"] < row["total"], f"org B's batch ended before the quote: {row}"
            return row
        if time.monotonic() > deadline:
            raise RuntimeError(f"batch {public_id} did not start running")
        time.sleep(0.1)


def _window(bench, Row, records):
    s = bench.stack
    big = _file(bench, "est-miss.jsonl", records, start=30_000)
    small = _file(bench, "est-fit.jsonl", max(10, records // 50), start=40_000)
    window = max(3, int(quote(bench.api, big)["time"]["expected_duration_s"] / 2))
    s.stop(s.web)
    short = f"{window}s"
    bench.connect(s.start_web(OPENRELAY_COMPLETION_WINDOWS=f"{short}:0.5,24h:0.5"))
    try:
        misses, fits = quote(bench.api, big, short), quote(bench.api, small, short)
        missed, _, _ = bench.api.create(big, window=short)
        fitted, _, _ = bench.api.create(small, window=short)
        missed_row = bench.wait_done(missed["id"], window + 180)
        fitted_row = bench.wait_done(fitted["id"], window + 180)
    finally:
        s.stop(s.web)
        bench.connect(s.start_web())
    right = (misses["fits_window"], missed_row["status"], fits["fits_window"], fitted_row["status"]) == (
        False,
        "expired",
        True,
        "completed",
    )
    bench.rows["estimate_window"] = Row(
        "estimate_window",
        ROW,
        f"quote: fits_window in a {window} s window",
        f"{misses['fits_window']} -> {missed_row['status']}, {fits['fits_window']} -> {fitted_row['status']}",
        TARGETS["estimate_window"],
        right,
        f"{records:,} records quoted {misses['time']['expected_duration_s']:.0f} s ({missed_row['completed']:,} "
        f"completed before expiry); {max(10, records // 50)} records quoted {fits['time']['expected_duration_s']:.1f} s",
        {"window_s": window, "misses": misses["fits_window"], "fits": fits["fits_window"]},
    )
    bench.report(
        f"{ROW}: window {window} s: {misses['fits_window']} -> {missed_row['status']}, "
        f"{fits['fits_window']} -> {fitted_row['status']}"
    )


def _speed(bench, Row):
    s, sc = bench.stack, bench.scale
    path = bench.tmp / "est-big.jsonl"
    size = write_shaped(path, sc.big, CAPACITY_MODEL, line_bytes=sc.line_bytes)
    file_id, _ = bench.api.upload(path)
    measured = {}
    for name in ("quote", "create"):
        s.stop(s.web)  # a fresh web process each: its RSS growth is this request's own
        bench.connect(s.start_web())
        with PeakRss(s.web.pid) as rss:
            started = time.perf_counter()
            if name == "quote":
                answer = quote(bench.api, file_id)
                assert answer["request_counts"]["total"] == sc.big, answer["request_counts"]
            else:
                batch, _, _ = bench.api.create(file_id)
            measured[name] = (time.perf_counter() - started, rss.growth_mb)
    bench.api.cancel(batch["id"])  # no cluster runs: it never starts
    (quote_s, quote_mb), (create_s, create_mb) = measured["quote"], measured["create"]
    ratio = quote_s / create_s
    bench.rows["estimate_speed"] = Row(
        "estimate_speed",
        ROW,
        f"quote, {sc.big:,} records / {size / MB:.0f} MB file",
        f"{ratio:.2f}x create, +{quote_mb:.0f} MB",
        TARGETS["estimate_speed"],
        ratio <= 2 and quote_mb <= max(create_mb * 1.5, create_mb + 20),
        f"quote {quote_s:.2f} s ({answer['input_tokens']['counted_records']} records tokenized, "
        f"±{answer['input_tokens']['error_pct']}%) vs create {create_s:.2f} s over HTTP; web RSS "
        f"+{quote_mb:.0f} MB vs +{create_mb:.0f} MB",
        {"quote_s": quote_s, "create_s": create_s, "quote_rss_mb": quote_mb, "create_rss_mb": create_mb},
    )
    bench.report(f"{ROW}: quote {quote_s:.2f} s vs create {create_s:.2f} s; RSS +{quote_mb:.0f} vs +{create_mb:.0f} MB")
