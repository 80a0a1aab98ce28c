# Price now lives with the rest of the model catalog (openrelay.core, app label openrelay). Django's
# state forgets it here; the table (billing_price) stays where it is and is the core's now. The admin's
# content type follows, so permissions granted on prices keep working.

from django.db import migrations


def content_type_to(source, target):
    def move(apps, schema_editor):
        ContentType = apps.get_model("contenttypes", "ContentType")
        if not ContentType.objects.filter(app_label=target, model="price").exists():
            ContentType.objects.filter(app_label=source, model="price").update(app_label=target)
    return move


class Migration(migrations.Migration):

    dependencies = [
        ('billing', '0003_price_cached_input_optional'),
        ('openrelay', '0005_price'),
        ('contenttypes', '0002_remove_content_type_name'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name='Price')],
            database_operations=[],
        ),
        migrations.RunPython(content_type_to("billing", "openrelay"), content_type_to("openrelay", "billing")),
    ]
