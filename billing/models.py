from decimal import Decimal

from django.db import models
from django.utils import timezone

from openrelay.models import Model, Organization


class Price(models.Model):
    """Sync-rate prices of a model, USD per 1M tokens. Batches snapshot them at create."""

    model = models.OneToOneField(Model, models.CASCADE, related_name="price")
    input_per_mtok = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"))
    cached_input_per_mtok = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"))
    output_per_mtok = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"))
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self):
        return f"{self.model.name}: in {self.input_per_mtok} / cached {self.cached_input_per_mtok} / out {self.output_per_mtok}"


class LedgerEntry(models.Model):
    """What a batch was billed, written once at its terminal transition."""

    organization = models.ForeignKey(Organization, models.PROTECT, related_name="ledger_entries")
    # The batch's public id: billing keeps the books but never drives a batch.
    batch_id = models.CharField(max_length=64, unique=True)
    model_name = models.CharField(max_length=200)
    priority = models.CharField(max_length=16)
    input_tokens = models.BigIntegerField(default=0)
    cached_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)
    cost_input = models.DecimalField(max_digits=20, decimal_places=10, default=Decimal("0"))
    cost_cached_input = models.DecimalField(max_digits=20, decimal_places=10, default=Decimal("0"))
    cost_output = models.DecimalField(max_digits=20, decimal_places=10, default=Decimal("0"))
    cost_total = models.DecimalField(max_digits=20, decimal_places=10, default=Decimal("0"))
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name_plural = "ledger entries"
        ordering = ["-created_at"]
