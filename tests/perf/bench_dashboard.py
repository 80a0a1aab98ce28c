"""Dashboard costs (issue 26), in throwaway state (not collected by pytest):

    .venv/bin/python tests/perf/bench_dashboard.py                       # SQLite in a temp dir
    .venv/bin/python tests/perf/bench_dashboard.py --database-url postgres://postgres@127.0.0.1:5432/openrelay_dash

(On PostgreSQL it migrates the database named and empties it afterwards.)

1. progress samples: the bytes of a full store (MAX_SAMPLES), and the ms of one engine's sample
   transaction for 1, 10 and 100 running batches with full stores (batches.engine.samples.take);
2. the operator page's figures (batches.operator.overview, 5 queries) and its rendering, with
   100 running batches of 10 organizations, 1,000 leased records, 4 engines and 6 deployments;
3. a batch page's failures by code (selectors.failures) for 2,808 and 50,000 failed records.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def setup(database_url):
    import os
    import tempfile

    os.environ.setdefault("OPENRELAY_DATA_DIR", tempfile.mkdtemp(prefix="dashbench-"))
    os.environ.setdefault("OPENRELAY_LOG_LEVEL", "WARNING")
    if database_url:
        os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "openrelay.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", "--noinput", verbosity=0)
    if database_url:
        return lambda: call_command("flush", "--noinput", verbosity=0)
    return None


def timed(fn, repeat=20):
    runs = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - started) * 1000)
    return statistics.median(runs)


def world(batches=100, organizations=10):
    from django.utils import timezone

    from batches import progress
    from batches.models import Batch, Engine, Record, RecordStatus
    from files import services as file_services
    from openrelay.core.models import Deployment, Model, Organization

    model = Model.objects.create(name="openrelay/gemma-4-31b")
    deployments = [
        Deployment.objects.create(model=model, base_url=f"http://10.0.0.{i}:8000/v1", max_concurrency=64)
        for i in range(6)
    ]
    for i in range(4):
        Engine.objects.create(owner=f"bench:{i}", calls={str(d.pk): [16, 900, 3] for d in deployments})
    orgs = [Organization.objects.create(name=f"org-{i}") for i in range(organizations)]
    now = timezone.now()
    full = []
    for i in range(progress.MAX_SAMPLES + 40):
        full = progress.appended(full, now.timestamp() - 1000 + 2 * i, 100 * i, i) or full
    rows = []
    for i in range(batches):
        org = orgs[i % organizations]
        file = file_services.create_file_from_chunks(
            organization=org, filename="in.jsonl", purpose="batch", chunks=[b"{}\n"]
        )
        rows.append(
            Batch(
                organization=org,
                endpoint="/v1/chat/completions",
                model=model,
                model_name=model.name,
                input_file=file,
                input_file_public_id=file.public_id,
                status="in_progress",
                created_at=now,
                in_progress_at=now,
                expires_at=now + timezone.timedelta(hours=24),
                total_count=50_000,
                completed_count=12_000,
                failed_count=40,
                progress=full,
            )
        )
    created = Batch.objects.bulk_create(rows)
    Record.objects.bulk_create(
        [
            Record(batch=batch, line=j, custom_id=str(j), offset=0, length=1, status=RecordStatus.RUNNING)
            for batch in created
            for j in range(10)
        ],
        batch_size=2000,
    )
    return created, full


def bench_samples(batches, full):
    from batches.engine import samples
    from batches.models import Batch

    print(f"progress store: {len(full)} samples, {len(str(full).replace(' ', ''))} bytes of JSON when full")
    for n in (1, 10, 100):
        pks = [b.pk for b in batches[:n]]

        def take(pks=pks):  # this iteration's pks, bound at definition (B023)
            Batch.objects.filter(pk__in=pks).update(progress=full)  # due again (the last sample is old)
            samples.take(pks)

        reset = timed(lambda pks=pks: Batch.objects.filter(pk__in=pks).update(progress=full))
        print(f"  one engine's sample transaction, {n:>3} batches: {timed(take) - reset:.2f} ms")


def bench_operator():
    from batches import operator
    from batches.dashboard.display import operator_fragment

    print(
        f"operator figures (overview): {timed(operator.overview):.1f} ms; rendered page: "
        f"{timed(operator_fragment):.1f} ms"
    )


def bench_failures(org):
    from batches import selectors
    from batches.models import Batch, Record, RecordStatus
    from tests.helpers import make_batch

    for n in (2808, 50_000):
        batch = make_batch(org, status="completed", total=n, failed=n)
        Record.objects.bulk_create(
            [
                Record(
                    batch=batch,
                    line=j,
                    custom_id=str(j),
                    offset=0,
                    length=1,
                    status=RecordStatus.FAILED,
                    error_code="",
                    status_code=(400, 404, 500)[j % 3],
                )
                for j in range(n)
            ],
            batch_size=5000,
        )
        print(
            f"failures by code of {n:,} failed records: {timed(lambda pk=batch.pk: selectors.failures(pk), 5):.1f} ms"
        )
        Batch.objects.filter(pk=batch.pk).delete()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--database-url", default="")
    args = parser.parse_args()
    dropper = setup(args.database_url)
    try:
        from django.db import connection

        print(f"database: {connection.vendor}")
        batches, full = world()
        bench_samples(batches, full)
        bench_operator()
        bench_failures(batches[0].organization)
    finally:
        if dropper:
            dropper()


if __name__ == "__main__":
    main()
