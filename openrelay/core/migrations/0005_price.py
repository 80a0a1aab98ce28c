# The catalog's prices join the catalog: Price moves from the billing app to the core, in Django's
# state only. Its table keeps its name (billing_price), so nothing is copied and no row changes.

import django.core.validators
import django.db.models.deletion
from decimal import Decimal
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('openrelay', '0004_deployment_health'),
        ('billing', '0003_price_cached_input_optional'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='Price',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('input_per_mtok', models.DecimalField(decimal_places=6, default=Decimal('0'), max_digits=12, validators=[django.core.validators.MinValueValidator(Decimal('0'))])),
                        ('cached_input_per_mtok', models.DecimalField(blank=True, decimal_places=6, default=None, help_text='Leave empty to bill cached input tokens at the input price; set it to discount them.', max_digits=12, null=True, validators=[django.core.validators.MinValueValidator(Decimal('0'))])),
                        ('output_per_mtok', models.DecimalField(decimal_places=6, default=Decimal('0'), max_digits=12, validators=[django.core.validators.MinValueValidator(Decimal('0'))])),
                        ('updated_at', models.DateTimeField(auto_now=True)),
                        ('model', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='price', to='openrelay.model')),
                    ],
                    options={'db_table': 'billing_price'},
                ),
            ],
            database_operations=[],
        ),
    ]
