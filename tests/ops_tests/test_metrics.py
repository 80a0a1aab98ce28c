"""GET /metrics: off until a token is set, Bearer auth, and figures that rise by exactly a batch's work."""

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from batches import tallies
from batches.models import Batch, Record, Tally
from batches.presenters import batch_object
from tests.helpers import MODEL, chat, make_batch, make_persona, read_lines, status_of, wait_for

pytestmark = pytest.mark.usefixtures("tmp_storage")  # stored files in tmp_path (tests/fixtures/storage.py)

TOKEN = "metrics-token-7f3a9c"


def scrape(client=None):
    response = (client or Client()).get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    return response.content.decode()


def samples(text):
    """{(name, frozenset(labels)): value} of every sample."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(figures, name, **labels):
    return figures.get((name, frozenset(labels.items())), 0)


@pytest.fixture
def token(settings):
    settings.OPENRELAY_METRICS_TOKEN = TOKEN


def test_it_is_off_until_a_token_is_set(db, settings):
    settings.OPENRELAY_METRICS_TOKEN = ""
    assert Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 404


def test_it_wants_the_token_as_a_bearer_credential(db, token):
    assert Client().get("/metrics").status_code == 401
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert Client().get("/metrics", HTTP_AUTHORIZATION=TOKEN).status_code == 401
    assert "openrelay_batches" in scrape()


def test_it_rises_by_exactly_the_records_and_tokens_of_a_batch_run_through_real_workers(model, clusters, token):
    alice = make_persona("alice-org")
    deployment = str(model.deployments.get().pk)
    before = samples(scrape())
    batch = make_batch(alice.org, [chat(f"question {i}") for i in range(12)])
    clusters()
    wait_for(lambda: status_of(batch) == "completed", 60, "the batch to complete")
    # Calls are saved with the engines' heartbeats (every 0.5 s): poll for them.
    wait_for(
        lambda: (
            value(
                samples(scrape()), "openrelay_model_calls_total", model=MODEL, deployment=deployment, status_class="2xx"
            )
            - value(before, "openrelay_model_calls_total", model=MODEL, deployment=deployment, status_class="2xx")
            >= 12
        ),
        30,
        "the calls to be counted",
    )
    text = scrape()
    after = samples(text)

    def rise(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    batch.refresh_from_db()
    out = read_lines(batch.output_file)
    assert rise("openrelay_records_finished_total", model=MODEL, outcome="succeeded") == 12
    assert (
        rise("openrelay_tokens_total", model=MODEL, kind="input")
        == batch.input_tokens
        == sum(line["response"]["body"]["usage"]["prompt_tokens"] for line in out)
        > 0
    )
    assert rise("openrelay_tokens_total", model=MODEL, kind="output") == batch.output_tokens > 0
    assert rise("openrelay_tokens_total", model=MODEL, kind="cached") == batch.cached_tokens
    assert rise("openrelay_model_calls_total", model=MODEL, deployment=deployment, status_class="2xx") == 12
    assert rise("openrelay_model_call_duration_seconds_count", model=MODEL, deployment=deployment) == 12
    assert rise("openrelay_model_call_duration_seconds_bucket", model=MODEL, deployment=deployment, le="+Inf") == 12
    assert rise("openrelay_batches", status="completed") == 1
    assert value(after, "openrelay_pending_records", model=MODEL) == 0
    assert value(after, "openrelay_deployment_concurrency_limit", model=MODEL, deployment=deployment) == 16
    # The adaptive limit the engines hold now (batches.engine.calls.flow): between 1 and the ceiling.
    assert 1 <= value(after, "openrelay_deployment_concurrency_current", model=MODEL, deployment=deployment) <= 16
    assert value(after, "openrelay_deployment_up", model=MODEL, deployment=deployment) == 1
    assert value(after, "openrelay_engines") == 2
    # Published latency (batches.latency): the batch observed once, in its window's histograms.
    shown = batch_object(batch)["openrelay"]
    for figure in ("first_result", "complete"):
        name = f"openrelay_batch_time_to_{figure}_seconds"
        assert rise(f"{name}_count", window="24h") == 1
        assert rise(f"{name}_sum", window="24h") == pytest.approx(shown[f"time_to_{figure}"], abs=0.002)
    # Cardinality and privacy: no organization, batch or custom_id is a label.
    for word in ("alice", batch.public_id, "req-1"):
        assert word not in text
    labels = {label for name, pairs in after for label, _ in pairs}
    # `reason`: why batches paused (batches.guardrails), one of four words.
    # `window`: the completion windows the operator offers.
    allowed = {"model", "deployment", "outcome", "kind", "status", "status_class", "result", "le", "reason", "window"}
    assert labels <= allowed, labels


def test_it_counts_failures_by_outcome_code_and_deliveries_and_queues(db, token, settings):
    alice = make_persona("alice-org")
    from openrelay.core.models import Model

    Model.objects.create(name=MODEL)
    batch = make_batch(alice.org, [chat(f"q {i}") for i in range(5)])
    Record.objects.filter(batch=batch, line=1).update(status="failed", status_code=400)
    Record.objects.filter(batch=batch, line=2).update(status="failed", error_code="request_time_limit")
    Record.objects.filter(batch=batch, line=3).update(
        status="running", lease_owner="e", lease_expires_at=timezone.now()
    )
    Batch.objects.filter(pk=batch.pk).update(status="in_progress", failed_count=2)
    figures = samples(scrape())
    assert value(figures, "openrelay_records_finished_total", model=MODEL, outcome="http_400") == 1
    assert value(figures, "openrelay_records_finished_total", model=MODEL, outcome="request_time_limit") == 1
    assert value(figures, "openrelay_pending_records", model=MODEL) == 2  # 5 - 2 finished - 1 claimed
    assert value(figures, "openrelay_records_in_flight", model=MODEL) == 1
    assert value(figures, "openrelay_batches", status="in_progress") == 1
    assert value(figures, "openrelay_webhook_deliveries", result="delivered") == 0


def test_tallies_add_up_across_saves(db, token):
    tallies.save({"lease_lost": 2, "resumed": 1})
    tallies.save({"lease_lost": 3})
    assert dict(Tally.objects.values_list("key", "value")) == {"lease_lost": 5, "resumed": 1}
    figures = samples(scrape())
    assert value(figures, "openrelay_lease_losses_total") == 5
    assert value(figures, "openrelay_record_resumes_total") == 1


def test_calls_in_flight_rise_while_real_workers_call_and_a_dead_deployment_reads_down(model, clusters, token):
    from openrelay.core.models import Deployment
    from tests.ops_tests.conftest import closed_port

    alive = model.deployments.get()
    dead = Deployment.objects.create(
        model=model, base_url=f"http://127.0.0.1:{closed_port()}/v1", upstream_model="m", max_concurrency=8
    )
    pair = {"model": MODEL, "deployment": str(alive.pk)}
    gone = {"model": MODEL, "deployment": str(dead.pk)}
    alice = make_persona("alice-org")
    batch = make_batch(alice.org, [chat(f"slow {i} [[latency:1500]]") for i in range(40)])
    clusters()

    # Engines publish their calls with each heartbeat (every 0.5 s): poll a scrape while the calls last.
    wait_for(lambda: value(samples(scrape()), "openrelay_calls_in_flight", **pair) > 0, 30, "calls in flight")
    figures = samples(scrape())
    assert value(figures, "openrelay_calls_in_flight", **pair) <= 16  # never past the deployment's limit
    wait_for(
        lambda: (
            value(samples(scrape()), "openrelay_deployment_up", **gone) == 0
            and value(samples(scrape()), "openrelay_model_calls_total", status_class="failed", **gone) > 0
        ),
        30,
        "the dead deployment read down, its failed calls counted",
    )
    assert value(samples(scrape()), "openrelay_deployment_up", **pair) == 1
    wait_for(lambda: status_of(batch) == "completed", 60, "the batch to complete")
    wait_for(lambda: value(samples(scrape()), "openrelay_calls_in_flight", **pair) == 0, 10, "no call in flight")


def test_webhook_deliveries_are_counted_by_result(db, token):
    from webhooks.models import WebhookDelivery, WebhookEndpoint

    alice = make_persona("alice-org")
    endpoint = WebhookEndpoint.objects.create(
        organization=alice.org,
        name="hook",
        url="https://hooks.example/x",
        event_types=["batch.completed"],
        signing_secret="whsec_test",
    )
    for status, n in (("pending", 1), ("delivered", 3), ("failed", 2)):
        WebhookDelivery.objects.bulk_create(
            [
                WebhookDelivery(endpoint=endpoint, event_type="batch.completed", payload="{}", status=status)
                for _ in range(n)
            ]
        )
    figures = samples(scrape())
    assert [
        value(figures, "openrelay_webhook_deliveries", result=result) for result in ("pending", "delivered", "failed")
    ] == [1, 3, 2]
    assert "whsec_test" not in scrape() and "hooks.example" not in scrape()
