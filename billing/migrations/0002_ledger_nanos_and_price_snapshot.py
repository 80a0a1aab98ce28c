# Ledger amounts move from DecimalField to integer nano-dollars (exact on
# SQLite too, see billing/pricing.py); entries also keep the batch's prices,
# status and reasoning tokens.

from decimal import ROUND_HALF_EVEN, Decimal

import django.core.validators
from django.db import migrations, models

AMOUNTS = (
    ("cost_input", "input_cost_nanos"),
    ("cost_cached_input", "cached_input_cost_nanos"),
    ("cost_output", "output_cost_nanos"),
)


def to_nanos(value):
    return int((value * 10**9).to_integral_value(rounding=ROUND_HALF_EVEN))


def convert_amounts(apps, schema_editor):
    LedgerEntry = apps.get_model("billing", "LedgerEntry")
    for entry in LedgerEntry.objects.all():
        for old, new in AMOUNTS:
            setattr(entry, new, to_nanos(getattr(entry, old)))
        # The total stays the sum of its parts.
        entry.total_cost_nanos = sum(getattr(entry, new) for _, new in AMOUNTS)
        entry.save(update_fields=[new for _, new in AMOUNTS] + ["total_cost_nanos"])


def restore_amounts(apps, schema_editor):
    LedgerEntry = apps.get_model("billing", "LedgerEntry")
    for entry in LedgerEntry.objects.all():
        for old, new in AMOUNTS:
            setattr(entry, old, Decimal(getattr(entry, new)).scaleb(-9))
        entry.cost_total = Decimal(entry.total_cost_nanos).scaleb(-9)
        entry.save(update_fields=[old for old, _ in AMOUNTS] + ["cost_total"])


def not_negative():
    return [django.core.validators.MinValueValidator(Decimal("0"))]


class Migration(migrations.Migration):

    dependencies = [
        ("billing", "0001_initial"),
        ("openrelay", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="ledgerentry",
            name="batch_status",
            field=models.CharField(default="", max_length=16),
            preserve_default=False,
        ),
        migrations.AddField(model_name="ledgerentry", name="reasoning_tokens", field=models.BigIntegerField(default=0)),
        migrations.AddField(
            model_name="ledgerentry",
            name="price_input",
            field=models.DecimalField(decimal_places=6, default=Decimal("0"), max_digits=12),
        ),
        migrations.AddField(
            model_name="ledgerentry",
            name="price_cached_input",
            field=models.DecimalField(decimal_places=6, default=Decimal("0"), max_digits=12),
        ),
        migrations.AddField(
            model_name="ledgerentry",
            name="price_output",
            field=models.DecimalField(decimal_places=6, default=Decimal("0"), max_digits=12),
        ),
        migrations.AddField(
            model_name="ledgerentry",
            name="price_multiplier",
            field=models.DecimalField(decimal_places=2, default=Decimal("0.5"), max_digits=4),
        ),
        migrations.AddField(model_name="ledgerentry", name="input_cost_nanos", field=models.BigIntegerField(default=0)),
        migrations.AddField(
            model_name="ledgerentry", name="cached_input_cost_nanos", field=models.BigIntegerField(default=0)
        ),
        migrations.AddField(model_name="ledgerentry", name="output_cost_nanos", field=models.BigIntegerField(default=0)),
        migrations.AddField(model_name="ledgerentry", name="total_cost_nanos", field=models.BigIntegerField(default=0)),
        migrations.RunPython(convert_amounts, restore_amounts),
        migrations.RemoveField(model_name="ledgerentry", name="cost_input"),
        migrations.RemoveField(model_name="ledgerentry", name="cost_cached_input"),
        migrations.RemoveField(model_name="ledgerentry", name="cost_output"),
        migrations.RemoveField(model_name="ledgerentry", name="cost_total"),
        migrations.AddIndex(
            model_name="ledgerentry",
            index=models.Index(fields=["organization", "created_at"], name="ledger_org_created"),
        ),
        migrations.AlterField(
            model_name="price",
            name="input_per_mtok",
            field=models.DecimalField(decimal_places=6, default=Decimal("0"), max_digits=12, validators=not_negative()),
        ),
        migrations.AlterField(
            model_name="price",
            name="cached_input_per_mtok",
            field=models.DecimalField(decimal_places=6, default=Decimal("0"), max_digits=12, validators=not_negative()),
        ),
        migrations.AlterField(
            model_name="price",
            name="output_per_mtok",
            field=models.DecimalField(decimal_places=6, default=Decimal("0"), max_digits=12, validators=not_negative()),
        ),
    ]
