from decimal import Decimal

from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

from billing.pricing import Cost
from openrelay.core.models import Model, Organization

_NOT_NEGATIVE = [MinValueValidator(Decimal("0"))]


class Price(models.Model):
    """Sync-rate prices of a model, USD per 1M tokens. Batches snapshot them at create."""

    model = models.OneToOneField(Model, models.CASCADE, related_name="price")
    input_per_mtok = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"), validators=_NOT_NEGATIVE)
    # Null: cached input is billed at the input price. A model server's prompt
    # cache is no discount of ours unless an operator sets one here.
    cached_input_per_mtok = models.DecimalField(
        max_digits=12, decimal_places=6, null=True, blank=True, default=None, validators=_NOT_NEGATIVE,
        help_text="Leave empty to bill cached input tokens at the input price; set it to discount them.",
    )
    output_per_mtok = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"), validators=_NOT_NEGATIVE)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self):
        return (f"{self.model.name}: in {self.input_per_mtok} / cached {self.effective_cached_input_per_mtok} / "
                f"out {self.output_per_mtok}")

    @property
    def effective_cached_input_per_mtok(self):
        """What a cached input token costs: the operator's cached price, or else the input price."""
        return self.input_per_mtok if self.cached_input_per_mtok is None else self.cached_input_per_mtok


class LedgerEntry(models.Model):
    """What a batch was billed, written once at its terminal transition.

    Amounts are integer nano-dollars (1e-9 USD); billing.pricing has the
    rounding rule and why they are integers.
    """

    organization = models.ForeignKey(Organization, models.PROTECT, related_name="ledger_entries")
    # The batch's public id: billing keeps the books but never drives a batch.
    # Unique, so a second bill of one batch cannot be written.
    batch_id = models.CharField(max_length=64, unique=True)
    batch_status = models.CharField(max_length=16)  # completed, expired or cancelled
    model_name = models.CharField(max_length=200)
    priority = models.CharField(max_length=16)
    input_tokens = models.BigIntegerField(default=0)  # prompt tokens, cached ones included
    cached_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)  # reasoning tokens included
    reasoning_tokens = models.BigIntegerField(default=0)
    # The batch's snapshotted prices (USD per 1M tokens, sync rate) and multiplier.
    price_input = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"))
    price_cached_input = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"))
    price_output = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"))
    price_multiplier = models.DecimalField(max_digits=4, decimal_places=2, default=Decimal("0.5"))
    input_cost_nanos = models.BigIntegerField(default=0)
    cached_input_cost_nanos = models.BigIntegerField(default=0)
    output_cost_nanos = models.BigIntegerField(default=0)
    total_cost_nanos = models.BigIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)  # when the batch was billed

    class Meta:
        verbose_name_plural = "ledger entries"
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["organization", "created_at"], name="ledger_org_created")]

    def __str__(self):
        return f"{self.batch_id}: {self.cost.as_object()['total']} USD"

    @property
    def cost(self):
        return Cost(self.input_cost_nanos, self.cached_input_cost_nanos, self.output_cost_nanos)
