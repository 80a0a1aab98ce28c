"""Published latency (batches.latency): time to the first result and to completion, on the batch
object and in GET /metrics' histograms by window, from the batch row alone."""

from datetime import timedelta

import pytest
from django.db.models import Min
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from batches import latency
from batches.engine import finish
from batches.engine.runner import run_batch
from batches.models import Batch, Record
from batches.presenters import batch_object
from tests.helpers import chat, make_batch

TOKEN = "metrics-token-latency"


@pytest.fixture
def scrape(settings):
    settings.OPENRELAY_METRICS_TOKEN = TOKEN

    def scrape():
        text = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").content.decode()
        return {
            (s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    return scrape


def _figure(figures, name, **labels):
    return figures.get((name, frozenset(labels.items())), 0)


def test_it_is_null_until_known_then_read_from_the_batch_row(alice, model, django_assert_num_queries):
    batch = make_batch(alice.org, [chat(f"question {i}") for i in range(40)], completion_window="24h")
    shown = batch_object(batch)["openrelay"]
    assert shown["time_to_first_result"] is None and shown["time_to_complete"] is None
    run_batch(batch.pk)
    batch = Batch.objects.select_related("output_file", "error_file").get(pk=batch.pk)
    assert batch.status == "completed"
    # The first result is the earliest finish of its records, set once by the flush that wrote it.
    first = Record.objects.filter(batch=batch).aggregate(first=Min("finished_at"))["first"]
    assert batch.first_result_at == first
    with django_assert_num_queries(0):
        shown = batch_object(batch)["openrelay"]
    assert shown["time_to_first_result"] == round((first - batch.created_at).total_seconds(), 3)
    assert shown["time_to_complete"] == round((batch.completed_at - batch.created_at).total_seconds(), 3)
    assert 0 < shown["time_to_first_result"] <= shown["time_to_complete"]


def test_a_failed_record_is_a_first_result_too(alice, model):
    batch = make_batch(alice.org, [chat("bad [[status:400]]")])
    run_batch(batch.pk)
    batch.refresh_from_db()
    assert (batch.status, batch.failed_count) == ("completed", 1)
    assert batch.first_result_at == Record.objects.get(batch=batch).finished_at


def test_it_observes_a_completed_batch_once_in_its_windows_histograms(alice, model, scrape, settings):
    settings.OPENRELAY_COMPLETION_WINDOWS = "60s:0.8,24h:0.5"
    before = scrape()
    batch = make_batch(alice.org, [chat(f"q {i}") for i in range(10)], window=timedelta(seconds=60))
    Batch.objects.filter(pk=batch.pk).update(completion_window="60s")
    run_batch(batch.pk)
    run_batch(batch.pk)  # a second run of a finished batch observes nothing again
    batch.refresh_from_db()
    after = scrape()

    def rise(name, **labels):
        return _figure(after, name, **labels) - _figure(before, name, **labels)

    first, complete = latency.time_to_first_result(batch), latency.time_to_complete(batch)
    for metric, seconds in (("first_result", first), ("complete", complete)):
        name = f"openrelay_batch_time_to_{metric}_seconds"
        assert rise(f"{name}_count", window="60s") == 1
        assert rise(f"{name}_sum", window="60s") == pytest.approx(seconds, abs=0.002)
        assert rise(f"{name}_bucket", window="60s", le="+Inf") == 1
        assert rise(f"{name}_bucket", window="60s", le="60.0") == (seconds <= 60)
        assert rise(f"{name}_count", window="24h") == 0


def test_an_expired_batch_none_of_whose_records_ran_has_neither_and_is_not_observed(alice, model, scrape):
    batch = make_batch(alice.org, [chat(f"q {i}") for i in range(3)], window=timedelta(seconds=1))
    past = timezone.now() - timedelta(seconds=5)
    Batch.objects.filter(pk=batch.pk).update(status="in_progress", in_progress_at=past, expires_at=past)
    before = scrape()
    batch.refresh_from_db()
    assert finish.expire_if_due(batch)
    batch.refresh_from_db()
    assert (batch.status, batch.failed_count) == ("expired", 3)
    shown = batch_object(batch)["openrelay"]
    assert shown["time_to_first_result"] is None and shown["time_to_complete"] is None
    after = scrape()
    name = "openrelay_batch_time_to_complete_seconds_count"
    assert _figure(after, name, window="24h") == _figure(before, name, window="24h")
