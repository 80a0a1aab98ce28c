import hashlib
from decimal import Decimal

from django.db import models
from django.utils import timezone

from files.models import File
from openrelay.core.models import Model, Organization
from openrelay.lib.ids import new_batch_id


class BatchStatus(models.TextChoices):
    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


class PauseReason(models.TextChoices):
    """Why a running batch is paused (batches.guardrails; the batch object's `openrelay.paused`)."""

    REQUESTED = "requested"  # its owner paused it (API, orl, dashboard)
    SPEND_CAP = "spend_cap"  # its next call could pass its max_cost
    ORGANIZATION_BUDGET = "organization_budget"  # its organization's monthly budget is spent
    ERROR_BREAKER = "error_breaker"  # its records fail in a way only the batch itself can explain


class Priority(models.TextChoices):
    STANDARD = "standard"
    EXPEDITED = "expedited"


class RecordStatus(models.TextChoices):
    PENDING = "pending"
    # A twin (batches.reuse): its request is another record's of the batch (its leader), never
    # claimed; the flush that writes the leader's outcome writes its own, in the same transaction.
    WAITING = "waiting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


TERMINAL_BATCH_STATUSES = (BatchStatus.COMPLETED, BatchStatus.FAILED, BatchStatus.EXPIRED, BatchStatus.CANCELLED)
FINISHED_RECORD_STATUSES = (RecordStatus.SUCCEEDED, RecordStatus.FAILED, RecordStatus.EXPIRED, RecordStatus.CANCELLED)


class BatchQuerySet(models.QuerySet):
    def for_org(self, organization):
        return self.filter(organization=organization)

    def active(self):
        return self.exclude(status__in=TERMINAL_BATCH_STATUSES)


class Batch(models.Model):
    public_id = models.CharField(max_length=64, unique=True, default=new_batch_id, editable=False)
    organization = models.ForeignKey(Organization, models.CASCADE, related_name="batches")
    endpoint = models.CharField(max_length=64)
    completion_window = models.CharField(max_length=8, default="24h")
    priority = models.CharField(max_length=16, choices=Priority.choices, default=Priority.STANDARD)
    metadata = models.JSONField(null=True, blank=True)
    output_expires_after_s = models.PositiveIntegerField(null=True, blank=True)

    # The model every record runs on: the first accepted record's model.
    model_name = models.CharField(max_length=200, blank=True)
    model = models.ForeignKey(Model, models.SET_NULL, null=True, blank=True, related_name="+")

    input_file = models.ForeignKey(File, models.SET_NULL, null=True, related_name="+")
    input_file_public_id = models.CharField(max_length=40)
    output_file = models.ForeignKey(File, models.SET_NULL, null=True, blank=True, related_name="+")
    error_file = models.ForeignKey(File, models.SET_NULL, null=True, blank=True, related_name="+")

    status = models.CharField(max_length=16, choices=BatchStatus.choices, default=BatchStatus.VALIDATING)
    # Records rejected at create (and batch-level errors): [{code, message, param, line}].
    errors = models.JSONField(null=True, blank=True)

    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    in_progress_at = models.DateTimeField(null=True, blank=True)
    finalizing_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    expired_at = models.DateTimeField(null=True, blank=True)
    cancelling_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    # Paused: an in_progress (or validating) batch that claims no records (batches.lifecycle.pause).
    # Its status stays OpenAI's: the SDKs know 8 statuses, and the window clock runs on.
    paused_at = models.DateTimeField(null=True, blank=True)
    pause_reason = models.CharField(max_length=32, choices=PauseReason.choices, blank=True)
    # {message, code?, line?, example?}: what the owner needs to decide whether to resume.
    pause_detail = models.JSONField(null=True, blank=True)
    resumed_at = models.DateTimeField(null=True, blank=True)

    # Guardrails (batches.guardrails): the spend cap in nano-dollars (null: none) and the error
    # breaker's rules (0 turns a rule off), fixed at create.
    max_cost_nanos = models.BigIntegerField(null=True, blank=True)
    breaker_window = models.PositiveIntegerField(default=0)
    breaker_failures = models.PositiveIntegerField(default=0)
    breaker_consecutive = models.PositiveIntegerField(default=0)

    # Live roll-ups, updated with F() expressions as records finish.
    total_count = models.PositiveIntegerField(default=0)
    completed_count = models.PositiveIntegerField(default=0)
    failed_count = models.PositiveIntegerField(default=0)
    input_tokens = models.BigIntegerField(default=0)
    cached_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)
    reasoning_tokens = models.BigIntegerField(default=0)
    # Records whose server-reported usage cannot be right (batches.engine.calls.usage): kept and
    # billed as reported, counted so an operator can see how far to trust the bill.
    implausible_usage_count = models.PositiveIntegerField(default=0)
    # Tokens of answers the batch's records got but are not billed for (a tool-calling record that
    # failed mid-loop, a result the database refused): counted against max_cost and the monthly
    # budget at the batch's prices all the same (docs/concepts/billing.md), rolled up like the above.
    unbilled_input_tokens = models.BigIntegerField(default=0)
    unbilled_cached_tokens = models.BigIntegerField(default=0)
    unbilled_output_tokens = models.BigIntegerField(default=0)
    # Output contracts (docs/guides/output-contracts.md): the batch's own contract from create (as
    # given, checked; false turns off those response_format gives), and, rolled up as records
    # finish, the records re-asked, the re-asks made and the records still invalid after them.
    output_contract = models.JSONField(null=True, blank=True)
    reasked_count = models.PositiveIntegerField(default=0)
    reasks_count = models.PositiveIntegerField(default=0)
    invalid_output_count = models.PositiveIntegerField(default=0)
    # Reuse (batches.reuse, docs/guides/reuse.md): the batch's `openrelay.reuse` mode from create; its
    # twins (records whose identical request another record of the batch runs), counted at create;
    # and, rolled up as they settle, the lines answered with a reused answer (twins and answers from
    # an earlier batch's cache) and the tokens those answers did not cost (beyond what was billed).
    # Each with a database default too (db_default): a rolling deploy's previous release still inserts
    # rows that do not name them (tests/test_migrations_compat.py, docs/guides/many-machines.md).
    reuse = models.CharField(max_length=16, default="auto", db_default="auto")
    # A "cache" batch's model deployments as create found them ("<pk>:<upstream model>", sorted, joined):
    # an answer is reused across batches only between batches of the same ones (batches.reuse).
    deployments_key = models.CharField(max_length=1000, blank=True, default="", db_default="")
    twin_count = models.PositiveIntegerField(default=0, db_default=0)
    reused_count = models.PositiveIntegerField(default=0, db_default=0)
    cache_hit_count = models.PositiveIntegerField(default=0, db_default=0)
    reused_input_tokens = models.BigIntegerField(default=0, db_default=0)
    reused_output_tokens = models.BigIntegerField(default=0, db_default=0)

    # Prices snapshotted at create (USD per 1M tokens, sync rate) and the multiplier of its window and
    # priority (batches.windows), so a later price or window change never reprices a batch.
    price_input = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"))
    price_cached_input = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"))
    price_output = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"))
    price_multiplier = models.DecimalField(max_digits=4, decimal_places=2, default=Decimal("0.5"))
    billed_at = models.DateTimeField(null=True, blank=True)
    # When batch.at_risk was sent (its expected completion passed expires_at, or admission found it
    # would): once a batch.
    at_risk_at = models.DateTimeField(null=True, blank=True, editable=False)
    # The quote's verdict at create (batches.estimate.admission): {fits_window, expected_duration_s,
    # expected_completion_at, basis, queued_records, warning}; null when none was asked.
    admission = models.JSONField(null=True, blank=True, editable=False)
    # When its first record ended, succeeded or failed (batches.latency): set once, by the flush (or the
    # reuse) that wrote the first outcome; records an expiry or a cancel closed unrun do not set it.
    first_result_at = models.DateTimeField(null=True, blank=True, editable=False)
    # [[t, completed, failed], ...] over the run, bounded (batches.progress): the chart and the rate.
    progress = models.JSONField(default=list, blank=True, editable=False)

    objects = BatchQuerySet.as_manager()

    class Meta:
        verbose_name_plural = "batches"
        indexes = [
            models.Index(fields=["organization", "-created_at"]),
            models.Index(fields=["status"]),
        ]

    def __str__(self):
        return self.public_id

    @property
    def is_terminal(self):
        return self.status in TERMINAL_BATCH_STATUSES

    @property
    def is_paused(self):
        return self.paused_at is not None and not self.is_terminal


class Record(models.Model):
    """One request of a batch. Points into the input file; never copies the body."""

    # No index of its own: record_batch_line_unique starts with batch_id and
    # serves every lookup by batch; a second index cost each claim and flush
    # an index insert per record (~10% of PostgreSQL's work). No database
    # constraint either: records are only ever inserted by create, in the
    # transaction that creates their batch, and deleted with it (Django's
    # CASCADE runs in the ORM); PostgreSQL's deferred check of 20,000 rows
    # cost create 0.18 s at commit.
    batch = models.ForeignKey(Batch, models.CASCADE, related_name="records", db_index=False, db_constraint=False)
    line = models.PositiveIntegerField()
    custom_id = models.CharField(max_length=512)
    offset = models.BigIntegerField()
    length = models.PositiveIntegerField()

    status = models.CharField(max_length=16, choices=RecordStatus.choices, default=RecordStatus.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    lease_owner = models.CharField(max_length=64, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # Its holder started it (a model call may be out), written before the record's first call
    # (batches.engine.trips.SentMarks), or ahead of its start (at most the engine's calls at the
    # model of a batch's queued records); a claim clears it. A dead engine's records that are not
    # `sent` go back to pending at its take-over; the sent ones are re-sent first (issue 55).
    sent = models.BooleanField(default=False, db_default=False)  # db_default: a previous release's inserts

    # The outcome, as the result line needs it.
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    request_id = models.CharField(max_length=64, blank=True)
    response_body = models.TextField(blank=True)  # JSON text of the upstream body
    error_code = models.CharField(max_length=64, blank=True)
    error_message = models.TextField(blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    # Billable usage of the run that produced the outcome (0 when not billed).
    prompt_tokens = models.BigIntegerField(default=0)
    cached_tokens = models.BigIntegerField(default=0)
    completion_tokens = models.BigIntegerField(default=0)
    reasoning_tokens = models.BigIntegerField(default=0)
    # 1 when some answer of the run reported usage that cannot be right, else 0: an integer, so
    # the flush rolls it up into Batch.implausible_usage_count with the token sums.
    usage_implausible = models.PositiveSmallIntegerField(default=0)
    # Re-asks its output contract made (batches.engine.loops.contract), rolled up like the usage.
    reasks = models.PositiveSmallIntegerField(default=0)
    # Usage of answers the record got but is not billed for (RecordOutcome.unbilled), rolled up into
    # the batch's unbilled counters.
    unbilled_prompt_tokens = models.BigIntegerField(default=0)
    unbilled_cached_tokens = models.BigIntegerField(default=0)
    unbilled_completion_tokens = models.BigIntegerField(default=0)

    # Reuse (batches.reuse): a twin's leader (the line of the record of its batch whose answer it
    # takes), null for any other record; a leader's count of twins (what makes its flush settle them);
    # and, on a reused line, whose answer it is (its result line's `openrelay.reused_from`): the
    # custom_id of its leader, or of the record of an earlier batch (`reused_batch`) it came from.
    leader_line = models.PositiveIntegerField(null=True, blank=True)
    # Database defaults too: a previous release's inserts name none of them (many-machines.md, rolling).
    twins = models.PositiveIntegerField(default=0, db_default=0)
    reused_from = models.CharField(max_length=512, blank=True, default="", db_default="")
    reused_batch = models.CharField(max_length=64, blank=True, default="", db_default="")
    # A "cache" batch's leader's request key (batches.reuse.request_key, hex): what a later batch of its
    # organization looks its answer up by. Null in any other batch, so only they fill the index.
    request_key = models.CharField(max_length=32, null=True, blank=True)  # noqa: DJ001 - null keeps rows out of the index

    # A multi-step record's loop state while it runs (batches.engine.checkpoints):
    # what a resumed run continues from. Null for plain records and once the
    # record is finished.
    checkpoint = models.BinaryField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["batch", "line"], name="record_batch_line_unique")]
        # Claims read "pending (or running) records of a batch past line N, in
        # line order": one range scan of this index, already in order. With
        # (batch, status) alone PostgreSQL read every pending record and
        # sorted them, half of a claim's time.
        indexes = [
            models.Index(fields=["batch", "status", "line"], name="record_batch_status_line"),
            # A leader's flush finds its twins. Partial: only twins' rows are in it, so a batch without
            # twins pays nothing for it (a full index cost every claim and flush an insert a record).
            models.Index(
                fields=["batch", "leader_line"],
                name="record_twins",
                condition=models.Q(leader_line__isnull=False),
            ),
            # The answer cache's lookup (batches.reuse.answer_from_cache), partial like the above.
            models.Index(
                fields=["request_key"],
                name="record_request_key",
                condition=models.Q(request_key__isnull=False),
            ),
        ]

    def __str__(self):
        return f"{self.batch_id}:{self.line}:{self.custom_id}"

    @property
    def public_id(self):
        """Stable `batch_req_` id, derived so finalizing twice writes the same id."""
        digest = hashlib.sha256(f"{self.batch_id}:{self.line}".encode()).hexdigest()
        return "batch_req_" + digest[:32]


class Engine(models.Model):
    """A live engine: one per worker process, on any machine.

    Its heartbeat (`seen_at`, renewed with its records' leases) is how the
    engines count each other: each takes its part of every deployment's
    max_concurrency and every organization's cap by its rank among the
    live ones (batches.engine.fairness.split). A clean stop deletes the
    row, so the others take its part at once. A joining engine takes its
    part only as the others give theirs up (`holding`), so together they
    never exceed a deployment's limit.
    """

    owner = models.CharField(max_length=64, unique=True)
    # {deployment id: the calls it may have in flight there now, max(its share, its calls)}:
    # an engine takes no more of a deployment than the others leave it.
    holding = models.JSONField(default=dict)
    host = models.CharField(max_length=100, blank=True)
    pid = models.PositiveIntegerField(default=0)
    started_at = models.DateTimeField(default=timezone.now)
    seen_at = models.DateTimeField(default=timezone.now, db_index=True)
    # {deployment id: [calls in flight, calls answered in the last minute, of which failed]},
    # published with the heartbeat: the operator page sums the live engines' rows.
    calls = models.JSONField(default=dict)
    # {deployment id: when a server there last refused this engine a call (a 503) after none had,
    # epoch seconds}, and the latest of them: the other engines watch `refused_at` (every
    # runner.WATCH_S) and stop slow start there at once, not after a doubling of their own into
    # the same full server (issue 55). Null: none yet (and a previous release's rows).
    refused = models.JSONField(null=True, blank=True)
    refused_at = models.DateTimeField(null=True, blank=True)

    def __str__(self):
        return self.owner


class Tally(models.Model):
    """A running total the engines add to: what leaves no row of its own (model calls by
    deployment and answer, their durations, lease losses, resumes); GET /metrics reads them.

    One row per series (`key` names it and its labels, batches.tallies), added to
    with an atomic upsert, so the totals are every engine's on every machine and outlive
    the engines that made them.
    """

    key = models.CharField(max_length=200, unique=True)
    value = models.BigIntegerField(default=0)

    def __str__(self):
        return f"{self.key} = {self.value}"
