"""What a GET /metrics scrape costs with 1,000,000 records stored (issue 23), in throwaway state:

    .venv/bin/python tests/perf/bench_metrics_scrape.py                     # SQLite in a temp dir
    .venv/bin/python tests/perf/bench_metrics_scrape.py --database-url postgres://postgres@127.0.0.1:5432/postgres

The store: 1,000 finished batches of 1,000 records (1% failed, four codes; ~300-byte answer
bodies, as results are), 20 running batches with claimed and pending records, 3 deployments
with call tallies. Prints the scrape's time (median and max of --runs), its queries and its
size, and beside it what reading the outcomes from every record would cost (a GROUP BY over
the whole record table: the design batches.metrics does not use).
"""

import argparse
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

from tests.perf.common import django_in_throwaway_database

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

BATCHES, PER_BATCH, RUNNING = 1_000, 1_000, 20


def setup(database_url):
    return django_in_throwaway_database(database_url, "metricsbench")


def fill():
    from django.db import connection
    from django.utils import timezone

    from batches import tallies
    from batches.models import Batch, Engine, Record
    from openrelay.core.models import Deployment, Model, Organization

    org = Organization.objects.create(name="bench-org")
    models = [Model.objects.create(name=f"bench/model-{i}") for i in range(2)]
    deployments = [
        Deployment.objects.create(
            model=models[i % 2], base_url=f"http://127.0.0.1:{9000 + i}/v1", upstream_model="m", max_concurrency=64
        )
        for i in range(3)
    ]
    now = timezone.now()
    total = BATCHES + RUNNING
    Batch.objects.bulk_create(
        [
            Batch(
                organization=org,
                endpoint="/v1/chat/completions",
                model=models[i % 2],
                model_name=models[i % 2].name,
                input_file_public_id="file-x",
                created_at=now,
                expires_at=now + timedelta(hours=24),
                status="completed" if i < BATCHES else "in_progress",
                total_count=PER_BATCH,
                completed_count=PER_BATCH - 10 if i < BATCHES else 300,
                failed_count=10 if i < BATCHES else 3,
                input_tokens=120_000,
                output_tokens=40_000,
            )
            for i in range(total)
        ],
        batch_size=500,
    )
    first = Batch.objects.order_by("pk").values_list("pk", flat=True).first()
    body = (
        "'" + '{"id":"chatcmpl-x","object":"chat.completion","choices":[{"index":0,"message":{"role":'
        '"assistant","content":"' + "x" * 160 + '"},"finish_reason":"stop"}],"usage":{"prompt_tokens":120}}' + "'"
    )
    n = total * PER_BATCH
    series = (
        f"SELECT generate_series AS n FROM generate_series(1, {n})"
        if connection.vendor == "postgresql"
        else f"WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < {n}) SELECT n FROM s"
    )
    # Lines 1-990 succeeded, 991-1000 failed (four codes) in finished batches; running batches:
    # 300 succeeded, 3 failed, 50 claimed, the rest pending.
    line = f"((n - 1) % {PER_BATCH} + 1)"
    running = f"(((n - 1) / {PER_BATCH}) >= {BATCHES})"
    status = (
        f"CASE WHEN {running} THEN (CASE WHEN {line} <= 300 THEN 'succeeded' WHEN {line} <= 303 THEN 'failed' "
        f"WHEN {line} <= 353 THEN 'running' ELSE 'pending' END) "
        f"WHEN {line} <= 990 THEN 'succeeded' ELSE 'failed' END"
    )
    code = (
        f"CASE WHEN {status} = 'failed' THEN (CASE {line} % 4 WHEN 0 THEN 'upstream_error' "
        f"WHEN 1 THEN 'request_time_limit' WHEN 2 THEN 'batch_expired' ELSE '' END) ELSE '' END"
    )
    status_code = f"CASE WHEN {status} = 'failed' AND {line} % 4 = 3 THEN 400 ELSE NULL END"
    table = connection.ops.quote_name(Record._meta.db_table)
    started = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute(
            f'INSERT INTO {table} (batch_id, line, custom_id, "offset", length, status, attempts, lease_owner, '
            f"request_id, response_body, error_code, error_message, prompt_tokens, cached_tokens, completion_tokens, "
            f"reasoning_tokens, usage_implausible, status_code) "
            f"SELECT {first} + (n - 1) / {PER_BATCH}, {line}, 'req-' || n, n * 400, 400, {status}, 1, '', 'req', "
            f"CASE WHEN {status} = 'succeeded' THEN {body} ELSE '' END, {code}, '', 120, 0, 40, 0, 0, {status_code} "
            f"FROM ({series}) AS numbers"
        )
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {table}")
    print(f"stored {Record.objects.count():,} records in {time.monotonic() - started:.1f} s ({connection.vendor})")
    for deployment in deployments:
        for _ in range(1000):
            tallies._deltas[f"calls|{deployment.pk}|2xx"] += 1  # what an engine's calls leave
        for bucket in range(len(tallies.BUCKETS_S) + 1):
            tallies._deltas[f"call_us|{deployment.pk}|{bucket}"] += 7
        tallies._deltas[f"call_us_sum|{deployment.pk}"] += 10**9
    tallies.save(tallies.take()[0])
    Engine.objects.create(owner="bench:1:a", calls={str(d.pk): [10, 600, 3] for d in deployments})


def measure(runs):
    from django.db import connection, reset_queries
    from django.db.models import Count
    from django.test.utils import CaptureQueriesContext

    from batches.metrics import scrape
    from batches.models import Record

    scrape()  # warm caches, as a scraper every 15 s sees them
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        text = scrape()
        times.append(time.perf_counter() - started)
    with CaptureQueriesContext(connection) as queries:
        scrape()
    query_count = len(queries)
    reset_queries()
    started = time.perf_counter()
    naive = list(
        Record.objects.exclude(status__in=["pending", "running"])
        .values_list("batch__model_name", "status", "error_code", "status_code")
        .annotate(n=Count("pk"))
        .order_by()
    )
    naive_s = time.perf_counter() - started
    lines = text.count(b"\n")
    print(
        f"scrape: median {statistics.median(times) * 1000:.1f} ms, max {max(times) * 1000:.1f} ms over {runs}, "
        f"{query_count} queries, {len(text):,} bytes, {lines:,} lines"
    )
    print(f"for comparison, outcomes grouped over every record: {naive_s * 1000:.0f} ms ({len(naive)} groups)")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--database-url", default="")
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    dropper = setup(args.database_url)
    try:
        fill()
        measure(args.runs)
    finally:
        if dropper:
            dropper()


if __name__ == "__main__":
    main()
