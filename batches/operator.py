"""What the operator page shows: every model and deployment at work, the queues, the running batches.

Everything is read from the database, so every web process shows the same
figures whichever engines made them:
- health, since when and the last error: the Deployment rows (engines write
  every change, batches.engine.calls.health);
- calls in flight, calls answered and failed by the deployment in the last minute (a record's own
  4xx is not the deployment failing: batches.callcount), and the
  adaptive concurrency limit (batches.engine.calls.flow), by deployment: the sum
  over the live engines' `Engine.calls`, which each engine publishes with
  its heartbeat (every 0.5 s); a dead engine's figures drop out with its
  heartbeat, after one lease;
- records in flight (leased: claimed by an engine, running or about to),
  queued (neither finished nor leased) and finished in the last minute, by
  model and organization: the running batches' rows and their running
  records (the batch/status/line index), and their progress samples
  (batches.progress: the last minute's samples are always kept). Calls of the last
  minute include a batch that just finished; records done count running batches
  only, and the page says so beside the two columns.

Calls and records differ: a tool-calling or workflow record makes several
calls, and a record waiting for its user's server holds none.
"""

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db.models import Count
from django.utils import timezone

from batches import progress
from batches.figures import Figures
from batches.models import Batch, BatchStatus, Engine, Record, RecordStatus
from openrelay.core.models import Model

RUNNING = (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS, BatchStatus.FINALIZING, BatchStatus.CANCELLING)
# The batches listed under each organization; the counts cover all of them.
BATCHES_SHOWN = 20


@dataclass
class Calls:
    in_flight: int = 0
    a_minute: int = 0
    failed_a_minute: int = 0
    limit: int | None = None  # the live engines' adaptive limits, summed; None: no engine works it now

    def add(self, figures):
        in_flight, a_minute, failed, limit = Figures.stored(figures)
        self.in_flight += in_flight
        self.a_minute += a_minute
        self.failed_a_minute += failed
        if limit is not None:
            self.limit = (self.limit or 0) + limit

    def limit_of(self, deployment):
        """The limit calls are held to now: the adaptive one, or max_concurrency while no engine works it."""
        return deployment.max_concurrency if self.limit is None else self.limit

    @property
    def error_rate(self):
        """Failed calls of the last minute, in %, or None when there were none."""
        return self.failed_a_minute * 100 / self.a_minute if self.a_minute else None


def state(deployment, calls):
    """A deployment's state as an operator reads it: "down" (out of the rotation, probed until it
    answers; batches.engine.calls.health), "failing" (in the rotation, but it failed calls in the
    last minute: no answer, 5xx, 401/403, the time limit; batches.callcount), "up",
    or "disabled"."""
    from openrelay.core.models import DeploymentHealth

    if not deployment.enabled:
        return "disabled"
    if deployment.health == DeploymentHealth.UNHEALTHY:
        return "down"
    return "failing" if calls.failed_a_minute else "up"


@dataclass
class Work:
    """Records of running batches: by model or by organization."""

    batches: int = 0
    total: int = 0
    done: int = 0
    in_flight: int = 0
    a_minute: int = 0  # records finished in the last minute

    @property
    def queued(self):
        return max(0, self.total - self.done - self.in_flight)

    def add(self, batch):
        self.batches += 1
        self.total += batch["total"]
        self.done += batch["done"]
        self.in_flight += batch["in_flight"]
        self.a_minute += batch["a_minute"]


@dataclass
class ModelView:
    name: str
    enabled: bool
    deployments: list = field(default_factory=list)  # [(Deployment, Calls)]
    calls: Calls = field(default_factory=Calls)
    limit: int = 0  # calls its deployments take at once now (their adaptive limits)
    ceiling: int = 0  # their max_concurrency
    work: Work = field(default_factory=Work)


@dataclass
class OrganizationView:
    name: str
    batches: list = field(default_factory=list)
    work: Work = field(default_factory=Work)


@dataclass
class Overview:
    models: list
    organizations: list
    engines: int
    at: object


def overview(now=None):
    """Five queries: live engines, models with their deployments, running batches, their leased records."""
    now = now or timezone.now()
    calls, engines = live_calls(now)
    batches = _running_batches(now.timestamp())
    models = []
    for model in Model.objects.prefetch_related("deployments"):
        view = ModelView(model.name, model.enabled)
        for deployment in model.deployments.all():
            figures = calls.get(deployment.pk, Calls())
            view.deployments.append((deployment, figures))
            if deployment.enabled:
                view.limit += figures.limit_of(deployment)
                view.ceiling += deployment.max_concurrency
                view.calls.add((figures.in_flight, figures.a_minute, figures.failed_a_minute, figures.limit))
        for batch in batches:
            if batch["model_id"] == model.pk:
                view.work.add(batch)
        models.append(view)
    return Overview(models, _by_organization(batches), engines, now)


def live_calls(now=None):
    """{deployment pk: Calls} summed over the live engines, and how many engines are live."""
    now = now or timezone.now()
    live = Engine.objects.filter(seen_at__gte=now - timedelta(seconds=settings.OPENRELAY_LEASE_S))
    calls, engines = defaultdict(Calls), 0
    for published in live.values_list("calls", flat=True):
        engines += 1
        for deployment, figures in (published or {}).items():
            calls[int(deployment)].add(figures)
    return calls, engines


def _running_batches(now_ts):
    rows = list(
        Batch.objects.filter(status__in=RUNNING)
        .order_by("created_at", "pk")
        .values(
            "pk",
            "public_id",
            "organization_id",
            "organization__name",
            "model_id",
            "model_name",
            "status",
            "priority",
            "total_count",
            "completed_count",
            "failed_count",
            "progress",
            "in_progress_at",
        )
    )
    leased = dict(
        Record.objects.filter(batch_id__in=[row["pk"] for row in rows], status=RecordStatus.RUNNING)
        .values_list("batch_id")
        .annotate(n=Count("pk"))
        .order_by()
    )
    batches = []
    for row in rows:
        done = row["completed_count"] + row["failed_count"]
        start = row["in_progress_at"].timestamp() if row["in_progress_at"] else None
        finished = progress.done_since(progress.series(start, row["progress"]), now_ts - 60, done)
        batches.append(
            {
                "id": row["public_id"],
                "pk": row["pk"],
                "organization_id": row["organization_id"],
                "organization": row["organization__name"],
                "model_id": row["model_id"],
                "model": row["model_name"],
                "status": row["status"],
                "priority": row["priority"],
                "total": row["total_count"],
                "done": done,
                "in_flight": leased.get(row["pk"], 0),
                "a_minute": finished,
            }
        )
    return batches


def _by_organization(batches):
    organizations = {}
    for batch in batches:
        view = organizations.setdefault(batch["organization_id"], OrganizationView(batch["organization"]))
        view.work.add(batch)
        if len(view.batches) < BATCHES_SHOWN:
            view.batches.append(batch)
    return sorted(organizations.values(), key=lambda view: (-view.work.in_flight, view.name))
