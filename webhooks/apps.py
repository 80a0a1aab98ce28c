from django.apps import AppConfig
from django.db.models.signals import post_migrate


def ensure_retry_schedule(**kwargs):
    """Register the retry sweep once (idempotent; runs after every migrate)."""
    from django_q.models import Schedule

    Schedule.objects.update_or_create(
        name="webhooks.deliver_due",
        defaults={"func": "webhooks.tasks.deliver_due", "schedule_type": Schedule.MINUTES, "minutes": 1,
                  "repeats": -1},
    )


class WebhooksConfig(AppConfig):
    name = "webhooks"
    label = "webhooks"
    verbose_name = "Webhooks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        post_migrate.connect(ensure_retry_schedule, sender=self)
