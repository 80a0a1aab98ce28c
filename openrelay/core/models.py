import hashlib
import secrets
from decimal import Decimal

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

KEY_PREFIX = "or_"
# The lookup prefix is the first characters of the key: enough to find the
# row with an index, too few to be useful on their own.
LOOKUP_LENGTH = 12
_NOT_NEGATIVE = [MinValueValidator(Decimal("0"))]


def hash_key(plaintext):
    # Keys are 256 bits of randomness, so a fast hash is safe here (no
    # dictionary to attack) and keeps authentication cheap.
    return hashlib.sha256(plaintext.encode()).hexdigest()


class Organization(models.Model):
    name = models.CharField(max_length=200, unique=True)
    workflows_enabled = models.BooleanField(default=False)
    max_concurrency = models.PositiveIntegerField(
        default=0,
        help_text="Most model calls the organization's batches keep in flight at once, over every model "
        "(0: no cap of its own; each model's max_concurrency still applies).",
    )
    monthly_budget = models.DecimalField(
        max_digits=14,
        decimal_places=2,
        null=True,
        blank=True,
        help_text="Most the organization's batches may cost in a calendar month (UTC), in USD. At it, creates "
        "are refused and running batches pause (empty: no budget).",
    )
    reuse_cache_ttl_s = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="How long, in seconds, an answer of this organization's batches can answer an identical request "
        'of its later batches that ask for the answer cache (openrelay.reuse "cache"). Empty: '
        "OPENRELAY_REUSE_CACHE_TTL_S; 0: no answer is reused across batches.",
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name


class Membership(models.Model):
    """A dashboard user's organization: one per user, managed in the admin or with `add_user`."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, models.CASCADE, related_name="membership")
    organization = models.ForeignKey(Organization, models.CASCADE, related_name="memberships")
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self):
        return f"{self.user} in {self.organization}"


class ApiKeyQuerySet(models.QuerySet):
    def active(self):
        return self.filter(revoked_at__isnull=True)


class ApiKey(models.Model):
    organization = models.ForeignKey(Organization, models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=200, blank=True)
    lookup = models.CharField(max_length=LOOKUP_LENGTH, unique=True, editable=False)
    hashed = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = ApiKeyQuerySet.as_manager()

    class Meta:
        verbose_name = "API key"

    def __str__(self):
        return f"{self.lookup}… ({self.organization})"

    @classmethod
    def issue(cls, organization, name=""):
        """Create a key and return (row, plaintext). The plaintext is shown once."""
        plaintext = KEY_PREFIX + secrets.token_urlsafe(32)
        row = cls.objects.create(
            organization=organization,
            name=name,
            lookup=plaintext[:LOOKUP_LENGTH],
            hashed=hash_key(plaintext),
        )
        return row, plaintext

    def revoke(self):
        self.revoked_at = timezone.now()
        self.save(update_fields=["revoked_at"])


class Model(models.Model):
    """A model in the catalog, by the public name records use."""

    name = models.CharField(max_length=200, unique=True)
    enabled = models.BooleanField(default=True)
    max_output_tokens = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Most tokens one answer of this model can hold: what a spend cap reserves for a request that "
        "sets no max_tokens (empty: OPENRELAY_DEFAULT_MAX_OUTPUT_TOKENS).",
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name


class DeploymentHealth(models.TextChoices):
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"


class MessagesApi(models.TextChoices):
    """How a deployment runs Anthropic Messages requests (`/v1/messages` records)."""

    TRANSLATE = "translate", "Translate to chat completions"
    NATIVE = "native", "Pass through to its /v1/messages"


class Deployment(models.Model):
    """One OpenAI-compatible server that can run a Model."""

    model = models.ForeignKey(Model, models.CASCADE, related_name="deployments")
    base_url = models.URLField(max_length=500, help_text="e.g. http://127.0.0.1:8001/v1")
    upstream_model = models.CharField(
        max_length=200, blank=True, help_text="Name sent upstream; defaults to the public name."
    )
    api_key = models.CharField(max_length=500, blank=True)
    max_concurrency = models.PositiveIntegerField(default=64)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)
    # Every deployment serves chat completions (the catalog's contract), so translating is the default
    # that always works; vLLM, llama.cpp and Ollama also serve /v1/messages and may take it as written.
    messages_api = models.CharField(
        max_length=16,
        choices=MessagesApi.choices,
        default=MessagesApi.TRANSLATE,
        help_text="Anthropic Messages records: translated to /v1/chat/completions, or sent to the server's "
        "own /v1/messages as written.",
    )

    # Written by the engines (batches.engine.calls.health) as they take a failing
    # deployment out of the rotation and probe it back in.
    health = models.CharField(
        max_length=16, choices=DeploymentHealth.choices, default=DeploymentHealth.HEALTHY, editable=False
    )
    health_changed_at = models.DateTimeField(null=True, blank=True, editable=False)
    # Out until a real call succeeds (a run of 500s, a refused key, no models route): another engine
    # that adopts the ejection sends canaries too, and forgives the 500s it counted there.
    needs_canary = models.BooleanField(default=False, editable=False)
    last_error = models.TextField(blank=True, editable=False, help_text="The last failure, without secrets.")

    class Meta:
        ordering = ["id"]

    def __str__(self):
        return f"{self.model.name} @ {self.base_url}"

    @property
    def upstream_name(self):
        return self.upstream_model or self.model.name


class Price(models.Model):
    """Sync-rate prices of a model, USD per 1M tokens. Batches snapshot them at create; billing/pricing.py
    has the arithmetic and the batch discount."""

    model = models.OneToOneField(Model, models.CASCADE, related_name="price")
    input_per_mtok = models.DecimalField(
        max_digits=12, decimal_places=6, default=Decimal("0"), validators=_NOT_NEGATIVE
    )
    # Null: cached input is billed at the input price. A model server's prompt
    # cache is no discount of ours unless an operator sets one here.
    cached_input_per_mtok = models.DecimalField(
        max_digits=12,
        decimal_places=6,
        null=True,
        blank=True,
        default=None,
        validators=_NOT_NEGATIVE,
        help_text="Leave empty to bill cached input tokens at the input price; set it to discount them.",
    )
    output_per_mtok = models.DecimalField(
        max_digits=12, decimal_places=6, default=Decimal("0"), validators=_NOT_NEGATIVE
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        # Made by the billing app before the catalog had one home: the table kept its name.
        db_table = "billing_price"

    def __str__(self):
        return (
            f"{self.model.name}: in {self.input_per_mtok} / cached {self.effective_cached_input_per_mtok} / "
            f"out {self.output_per_mtok}"
        )

    @property
    def effective_cached_input_per_mtok(self):
        """What a cached input token costs: the operator's cached price, or else the input price."""
        return self.input_per_mtok if self.cached_input_per_mtok is None else self.cached_input_per_mtok


class IdempotencyKey(models.Model):
    """An `Idempotency-Key` a create was sent with (openrelay.core.idempotency): what it made, for 24 h."""

    organization = models.ForeignKey(Organization, models.CASCADE, related_name="idempotency_keys")
    route = models.CharField(max_length=16)  # "batches", "files"
    key = models.CharField(max_length=255)
    fingerprint = models.CharField(max_length=64)  # sha256 of what the request asked for
    resource_id = models.CharField(max_length=64, blank=True)  # "" while the first request runs
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            # Two requests with one key at once: the second's insert fails here, whatever the timing.
            models.UniqueConstraint(fields=["organization", "route", "key"], name="idempotency_key_once")
        ]
        indexes = [models.Index(fields=["organization", "created_at"], name="idempotency_key_age")]

    def __str__(self):
        return f"{self.route} {self.key} -> {self.resource_id or '(running)'}"
