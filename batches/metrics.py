"""GET /metrics: Prometheus' text format, every figure read from the database at scrape time.

Why the database and not prometheus-client's multiprocess mode: the engines
run in worker processes on any number of machines, and a web process can
only read the files of the processes beside it; the database already holds
every figure the operator page shows, and the rest (calls by answer,
durations, lease losses, resumes) the engines add to `Tally` rows with their
heartbeats (batches.tallies). Any web process answers a scrape with
the same figures. Its cost does not grow with the records stored: records
are read only where they failed, through the batch/status/line index
(tests/perf/bench_metrics_scrape.py measures it with 1,020,000 records).

Labels are models, deployments (their id), statuses, outcome codes and
answer classes: never an organization, a batch or a custom_id.
"""

import secrets
from collections import defaultdict

from django.conf import settings
from django.db.models import Count, Q, Sum
from django.http import HttpResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from batches import latency, operator
from batches.models import Batch, PauseReason, Record, Tally
from batches.results import failure_code
from batches.selectors import ERROR_STATUSES
from batches.tallies import BUCKETS_S
from openrelay.core.models import DeploymentHealth
from webhooks.models import WebhookDelivery

TOKEN_KINDS = (
    ("input", "input_tokens"),
    ("cached", "cached_tokens"),
    ("output", "output_tokens"),
    ("reasoning", "reasoning_tokens"),
)


CONTRACT_KINDS = (("reasked", "reasked_count"), ("reasks", "reasks_count"), ("invalid_output", "invalid_output_count"))
# Reuse (batches.reuse): lines answered with a reused answer, of which from the answer cache, and the
# tokens those answers did not cost.
REUSE_KINDS = (
    ("reused", "reused_count"),
    ("cache_hits", "cache_hit_count"),
    ("saved_input_tokens", "reused_input_tokens"),
    ("saved_output_tokens", "reused_output_tokens"),
)


class DatabaseCollector:
    def collect(self):
        yield from _records_and_tokens()
        yield _batches_by_status()
        yield _paused_batches()
        overview = operator.overview()
        names = {}
        yield from _deployments(overview, names)
        yield from _tallies(names)
        yield from latency.families(_latency_tallies())
        yield _webhook_deliveries()


def _paused_batches():
    family = GaugeMetricFamily(
        "openrelay_batches_paused", "Running batches paused now, by reason (batches.guardrails).", labels=["reason"]
    )
    paused = Batch.objects.active().filter(paused_at__isnull=False)
    counts = dict(paused.values_list("pause_reason").annotate(n=Count("pk")).order_by())
    for reason, _ in PauseReason.choices:
        family.add_metric([reason], counts.get(reason, 0))
    return family


def _records_and_tokens():
    finished = CounterMetricFamily(
        "openrelay_records_finished",
        "Records finished, by model and outcome "
        "(succeeded, or the error file's code: http_<status>, request_time_limit, ...).",
        labels=["model", "outcome"],
    )
    tokens = CounterMetricFamily(
        "openrelay_tokens",
        "Tokens of finished records, by model and kind (input, cached of the input, output, reasoning of the output).",
        labels=["model", "kind"],
    )
    contracts = CounterMetricFamily(
        "openrelay_output_contracts",
        "Output contracts, by model: records re-asked, re-asks made, and records still invalid after "
        "their last re-ask (invalid_output).",
        labels=["model", "kind"],
    )
    reuse = CounterMetricFamily(
        "openrelay_reuse",
        "Reuse, by model: result lines answered with a reused answer (a twin's leader's, or the answer "
        "cache's), of which cache hits, and the input and output tokens those answers did not cost.",
        labels=["model", "kind"],
    )
    sums = {f"{kind}": Sum(column) for kind, column in TOKEN_KINDS + CONTRACT_KINDS + REUSE_KINDS}
    by_model = (
        Batch.objects.values("model_name").annotate(succeeded=Sum("completed_count"), **sums).order_by("model_name")
    )
    for row in by_model:
        finished.add_metric([row["model_name"], "succeeded"], row["succeeded"] or 0)
        for kind, _ in TOKEN_KINDS:
            tokens.add_metric([row["model_name"], kind], row[kind] or 0)
        for kind, _ in CONTRACT_KINDS:
            contracts.add_metric([row["model_name"], kind], row[kind] or 0)
        for kind, _ in REUSE_KINDS:
            reuse.add_metric([row["model_name"], kind], row[kind] or 0)
    for (model, outcome), n in sorted(_failures_by_model().items()):
        finished.add_metric([model, outcome], n)
    return finished, tokens, contracts, reuse


def _failures_by_model():
    """{(model, outcome code): records}: only batches with failures, only their error rows (the index)."""
    models = dict(Batch.objects.filter(failed_count__gt=0).values_list("pk", "model_name"))
    rows = (
        Record.objects.filter(batch_id__in=list(models), status__in=ERROR_STATUSES)
        .values_list("batch_id", "error_code", "status_code")
        .annotate(n=Count("pk"))
        .order_by()
    )
    failures = defaultdict(int)
    for batch_id, error_code, status_code, n in rows:
        failures[models[batch_id], failure_code(error_code, status_code)] += n
    return failures


def _batches_by_status():
    family = GaugeMetricFamily("openrelay_batches", "Batches, by status.", labels=["status"])
    counts = dict(Batch.objects.values_list("status").annotate(n=Count("pk")).order_by())
    for status in Batch._meta.get_field("status").choices:
        family.add_metric([status[0]], counts.get(status[0], 0))
    return family


def _deployments(overview, names):
    """The operator page's figures (batches.operator): one home for calls in flight and queues."""
    labels = ["model", "deployment"]
    in_flight = GaugeMetricFamily("openrelay_calls_in_flight", "Model calls in flight, by deployment.", labels=labels)
    limit = GaugeMetricFamily(
        "openrelay_deployment_concurrency_limit", "A deployment's max_concurrency (0 when disabled).", labels=labels
    )
    current = GaugeMetricFamily(
        "openrelay_deployment_concurrency_current",
        "The calls a deployment takes at once "
        "now: the live engines' adaptive limits summed (its max_concurrency while no engine "
        "works it; 0 when disabled).",
        labels=labels,
    )
    up = GaugeMetricFamily(
        "openrelay_deployment_up",
        "1 while a deployment is in the rotation, 0 while it is failing (out, probed) or disabled.",
        labels=labels,
    )
    queued = GaugeMetricFamily(
        "openrelay_pending_records",
        "Records of running batches neither finished nor claimed, by model (queue depth).",
        labels=["model"],
    )
    in_work = GaugeMetricFamily(
        "openrelay_records_in_flight", "Records claimed by an engine, by model.", labels=["model"]
    )
    for model in overview.models:
        queued.add_metric([model.name], model.work.queued)
        in_work.add_metric([model.name], model.work.in_flight)
        for deployment, calls in model.deployments:
            names[deployment.pk] = model.name
            pair = [model.name, str(deployment.pk)]
            in_flight.add_metric(pair, calls.in_flight)
            limit.add_metric(pair, deployment.max_concurrency if deployment.enabled else 0)
            current.add_metric(pair, calls.limit_of(deployment) if deployment.enabled else 0)
            up.add_metric(pair, int(deployment.enabled and deployment.health == DeploymentHealth.HEALTHY))
    engines = GaugeMetricFamily("openrelay_engines", "Live engines (one a worker process).", value=overview.engines)
    return in_flight, limit, current, up, queued, in_work, engines


def _tallies(names):
    calls = CounterMetricFamily(
        "openrelay_model_calls",
        "Model call attempts, by deployment and answer class (2xx, 4xx, 429, 5xx; failed: no answer; time_limit).",
        labels=["model", "deployment", "status_class"],
    )
    durations = HistogramMetricFamily(
        "openrelay_model_call_duration_seconds",
        "Model call attempts' durations, by deployment.",
        labels=["model", "deployment"],
    )
    lost = CounterMetricFamily(
        "openrelay_lease_losses",
        "Results an engine could not write: the record was no "
        "longer its own (its lease had passed to another engine, or its batch closed).",
    )
    resumed = CounterMetricFamily("openrelay_record_resumes", "Records claimed again at their checkpoint.")
    pauses = CounterMetricFamily(
        "openrelay_batch_pauses",
        "Batches paused, by reason (requested, spend_cap, organization_budget, error_breaker).",
        labels=["reason"],
    )
    batch_resumes = CounterMetricFamily("openrelay_batch_resumes", "Paused batches resumed.")
    buckets, sums = defaultdict(lambda: [0] * (len(BUCKETS_S) + 1)), defaultdict(int)
    for key, value in Tally.objects.values_list("key", "value"):
        name, *labels = key.split("|")
        if name == "calls":
            deployment, answer = labels
            calls.add_metric([names.get(int(deployment), ""), deployment, answer], value)
        elif name == "call_us":
            buckets[labels[0]][int(labels[1])] += value
        elif name == "call_us_sum":
            sums[labels[0]] += value
        elif name == "lease_lost":
            lost.add_metric([], value)
        elif name == "resumed":
            resumed.add_metric([], value)
        elif name == "pauses":
            pauses.add_metric(labels, value)
        elif name == "resumes":
            batch_resumes.add_metric([], value)
    for deployment, counts in sorted(buckets.items()):
        cumulative, total = [], 0
        for bound, n in zip([*map(str, BUCKETS_S), "+Inf"], counts):
            total += n
            cumulative.append((bound, total))
        durations.add_metric([names.get(int(deployment), ""), deployment], cumulative, sums[deployment] / 1e6)
    for family in (lost, resumed, batch_resumes):
        if not family.samples:
            family.add_metric([], 0)
    return calls, durations, lost, resumed, pauses, batch_resumes


def _latency_tallies():
    prefixes = Q(key__startswith="first_result_ms") | Q(key__startswith="complete_ms")
    return Tally.objects.filter(prefixes).values_list("key", "value")


def _webhook_deliveries():
    family = GaugeMetricFamily(
        "openrelay_webhook_deliveries",
        "Webhook deliveries, by result (pending: waiting for its next attempt).",
        labels=["result"],
    )
    counts = dict(WebhookDelivery.objects.values_list("status").annotate(n=Count("pk")).order_by())
    for status, _ in WebhookDelivery._meta.get_field("status").choices:
        family.add_metric([status], counts.get(status, 0))
    return family


def scrape():
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector())
    return generate_latest(registry)


def _authorized(request, token):
    sent = request.headers.get("Authorization", "")
    return sent.startswith("Bearer ") and secrets.compare_digest(sent[len("Bearer ") :].encode(), token.encode())


def metrics_view(request):
    """Off (404) until OPENRELAY_METRICS_TOKEN is set; then the token as a Bearer credential."""
    token = settings.OPENRELAY_METRICS_TOKEN
    if not token:
        return HttpResponse(status=404)
    if not _authorized(request, token):
        return HttpResponse(
            "A metrics token is required: Authorization: Bearer <OPENRELAY_METRICS_TOKEN>.\n",
            status=401,
            content_type="text/plain",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return HttpResponse(scrape(), content_type=CONTENT_TYPE_LATEST)
