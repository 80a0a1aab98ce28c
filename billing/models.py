from decimal import Decimal

from django.db import models
from django.utils import timezone

from billing.pricing import Cost
from openrelay.core.models import Organization


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
    # Tokens the batch's records got answers for but were not billed (a tool-calling record that
    # failed mid-loop), and what they came to at the same prices: never charged, but counted against
    # the organization's monthly budget (docs/concepts/billing.md).
    unbilled_input_tokens = models.BigIntegerField(default=0)
    unbilled_cached_tokens = models.BigIntegerField(default=0)
    unbilled_output_tokens = models.BigIntegerField(default=0)
    unbilled_cost_nanos = models.BigIntegerField(default=0)
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
