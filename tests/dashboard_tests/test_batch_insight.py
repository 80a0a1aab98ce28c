"""The batch list's search, filters and pages; a batch's failures by code, not-run records, metadata, rate and ETA."""

import re
from datetime import timedelta

import orjson
from django.utils import timezone

from batches.engine.runner import run_batch
from batches.models import Batch, Record, RecordStatus
from tests.dashboard_tests.conftest import page_html
from tests.helpers import chat, make_batch


def _ids(page):
    return re.findall(r'<tr data-batch="(batch_[^"]+)"', page)


# ---------------------------------------------------------------------------
# Batch list


def test_the_list_finds_batches_by_id_and_by_metadata(alice_client, alice, bob):
    invoices = make_batch(alice.org, metadata={"team": "billing", "job": "invoices-2026"})
    ocr = make_batch(alice.org, metadata={"team": "vision", "note": "café menus"})
    plain = make_batch(alice.org)
    make_batch(bob.org, metadata={"team": "billing"})
    assert _ids(page_html(alice_client.get("/?q=invoices"))) == [invoices.public_id]
    assert _ids(page_html(alice_client.get("/?q=team=VISION"))) == [ocr.public_id]  # key=value, any case
    assert _ids(page_html(alice_client.get("/?q=café"))) == [ocr.public_id]  # non-ASCII on SQLite's escaped JSON too
    assert _ids(page_html(alice_client.get(f"/?q={plain.public_id[-8:]}"))) == [plain.public_id]
    assert _ids(page_html(alice_client.get("/?q=billing"))) == [invoices.public_id]  # never another organization's
    nothing = page_html(alice_client.get("/?q=nowhere"))
    assert _ids(nothing) == [] and "No batch matches these filters" in nothing
    assert 'value="nowhere"' in nothing and "data-insert-new" not in nothing  # the state stays in the form


def test_the_list_filters_by_status_endpoint_and_model(alice_client, alice):
    running = make_batch(alice.org)
    done = make_batch(alice.org, status="completed", completed=10)
    embed = make_batch(alice.org, endpoint="/v1/embeddings", model_name="openrelay/embed-small")
    assert _ids(page_html(alice_client.get("/?status=completed"))) == [done.public_id]
    assert _ids(page_html(alice_client.get("/?endpoint=/v1/embeddings"))) == [embed.public_id]
    page = page_html(alice_client.get("/?model=openrelay/gemma-4-31b&status=in_progress"))
    assert _ids(page) == [running.public_id]
    assert '<option value="openrelay/embed-small">' in page  # the models its batches used
    assert '<option value="in_progress" selected>' in page
    assert _ids(page_html(alice_client.get("/?status=bogus"))) == [embed.public_id, done.public_id, running.public_id]


def test_the_list_pages_both_ways_keeping_its_filters(alice_client, alice, monkeypatch):
    monkeypatch.setattr("batches.dashboard.views.PAGE_SIZE", 2)
    base = timezone.now()
    batches = [make_batch(alice.org, metadata={"run": "nightly"}) for _ in range(5)]
    for i, batch in enumerate(batches):
        Batch.objects.filter(pk=batch.pk).update(created_at=base + timedelta(seconds=i))
    make_batch(alice.org)  # newest, but not nightly
    newest_first = [b.public_id for b in reversed(batches)]
    first = page_html(alice_client.get("/?q=nightly"))
    assert _ids(first) == newest_first[:2] and 'data-page="newer"' not in first
    older = re.search(r'href="\?([^"]+)" data-page="older"', first).group(1).replace("&amp;", "&")
    assert "q=nightly" in older
    second = page_html(alice_client.get(f"/?{older}"))
    assert _ids(second) == newest_first[2:4]
    third = page_html(
        alice_client.get("/?" + re.search(r'href="\?([^"]+)" data-page="older"', second).group(1).replace("&amp;", "&"))
    )
    assert _ids(third) == newest_first[4:] and 'data-page="older"' not in third
    back = re.search(r'href="\?([^"]+)" data-page="newer"', third).group(1).replace("&amp;", "&")
    assert _ids(page_html(alice_client.get(f"/?{back}"))) == newest_first[2:4]
    assert alice_client.get("/?after=batch_unknown").status_code == 404


def test_a_filtered_page_costs_the_same_queries_for_any_number_of_batches(
    alice_client, alice, django_assert_max_num_queries
):
    make_batch(alice.org, metadata={"team": "ml"})
    with django_assert_max_num_queries(7) as few:
        alice_client.get("/?q=team=ml&status=in_progress")
    for _ in range(12):
        make_batch(alice.org, metadata={"team": "ml"})
    with django_assert_max_num_queries(len(few.captured_queries)):
        assert len(_ids(page_html(alice_client.get("/?q=team=ml&status=in_progress")))) == 13


# ---------------------------------------------------------------------------
# Batch page


def _error_codes(lines):
    codes = {}
    for line in lines:
        line = orjson.loads(line)
        code = line["error"]["code"] if line["error"] else f"http_{line['response']['status_code']}"
        codes[code] = codes.get(code, 0) + 1
    return codes


def test_failures_by_code_match_the_error_file_and_each_code_downloads_its_lines(alice_client, alice, model):
    bodies = [
        chat("fine"),
        chat("bad [[status:400]]"),
        chat("bad [[status:400]]"),
        chat("gone [[status:404]]"),
        chat("fine"),
    ]
    batch = make_batch(alice.org, bodies)
    run_batch(batch.pk)
    batch.refresh_from_db()
    page = page_html(alice_client.get(f"/batches/{batch.public_id}"))
    shown = {
        code: int(count)
        for code, count in re.findall(r'<tr data-code="([^"]+)"[^>]*>.*?data-count>([\d,]+)</td>', page, re.S)
    }
    error_file = b"".join(alice_client.get(f"/files/{batch.error_file.public_id}/download").streaming_content)
    assert shown == _error_codes(error_file.splitlines()) == {"http_400": 2, "http_404": 1}
    assert re.search(r'href="/batches/[^"]+/so_far.jsonl\?kind=error&amp;code=http_400"', page)
    lines = b"".join(
        alice_client.get(f"/batches/{batch.public_id}/so_far.jsonl?kind=error&code=http_400").streaming_content
    ).splitlines()
    assert sorted(orjson.loads(line)["custom_id"] for line in lines) == ["req-2", "req-3"]


def test_a_cancelled_batch_tells_done_failed_and_not_run_apart(alice_client, alice):
    batch = make_batch(
        alice.org,
        status="cancelled",
        total=100,
        completed=30,
        failed=70,
        progress=[[1000.0, 0, 0], [1010.0, 30, 5]],
        cancelled_at=timezone.now(),
    )
    Record.objects.bulk_create(
        [
            Record(
                batch=batch,
                line=i,
                custom_id=f"r{i}",
                offset=0,
                length=1,
                status=RecordStatus.FAILED,
                error_code="tool_execution_failed",
            )
            for i in range(5)
        ]
        + [
            Record(
                batch=batch,
                line=10 + i,
                custom_id=f"c{i}",
                offset=0,
                length=1,
                status=RecordStatus.CANCELLED,
                error_code="batch_cancelled",
            )
            for i in range(65)
        ]
    )
    page = page_html(alice_client.get(f"/batches/{batch.public_id}"))
    stat = dict(re.findall(r'data-field="(completed|failed|not_run|percent)">([^<]+)<', page))
    assert stat == {"percent": "35%", "completed": "30", "failed": "5", "not_run": "65"}
    assert 'style="width: 65.00%"' in page  # the not-run part of the bar
    assert "5 failed, 65 not run" in page
    listed = page_html(alice_client.get("/"))
    assert re.search(r'data-field="not_run">65</span> not run', listed)


def test_the_batch_page_shows_metadata_rate_and_time_left(alice_client, alice):
    now = timezone.now()
    start = now - timedelta(seconds=100)
    batch = make_batch(
        alice.org,
        total=1000,
        completed=400,
        metadata={"team": "ml", "job": "nightly"},
        progress=[[start.timestamp() + 40, 100, 0], [now.timestamp() - 1, 400, 0]],
    )
    Batch.objects.filter(pk=batch.pk).update(in_progress_at=start)
    page = page_html(alice_client.get(f"/batches/{batch.public_id}"))
    assert re.search(r"<th><code>job</code></th><td>nightly</td>", page)
    rate = float(re.search(r'data-field="rate">([\d.]+)/s<', page).group(1))
    assert 4.9 <= rate <= 5.1  # 300 records in the last ~60 s
    assert re.search(r'data-field="eta">(1 min 5\d s|2 min 0\d s)<', page)  # 600 left at ~5 a second
    samples = orjson.loads(
        re.search(r'<script id="batch-samples" type="application/json">(.*?)</script>', page).group(1)
    )
    assert samples[0] == [int(start.timestamp()), 0, 0] and samples[-1][1] == 400


def test_the_engine_samples_progress_as_it_runs_and_the_close_ends_it_at_the_finish(alice, model):
    # 16 calls at a time, 0.8 s each: ten waves, ~8 s, so a sample every 2 s gives at least three even when a
    # loaded machine stretches the first waves (five waves, ~4 s, gave two samples on a busy CI run).
    batch = make_batch(alice.org, [chat(f"q{i} [[latency:800]]") for i in range(160)])
    run_batch(batch.pk)
    batch.refresh_from_db()
    assert batch.status == "completed"
    samples = batch.progress
    assert samples[-1] == [int(batch.completed_at.timestamp()), 160, 0]
    assert len(samples) >= 3, samples  # taken while it ran, at most every 2 s
    assert all(b[0] - a[0] >= 1.0 for a, b in zip(samples[:-1], samples[1:-1]))
    assert all(a[1] <= b[1] for a, b in zip(samples, samples[1:]))
    assert 0 < samples[-2][1] < 160
