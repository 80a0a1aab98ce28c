from django.apps import AppConfig

from openrelay.lib import schedules

# Retries deliveries that are due, and sends any whose first attempt was lost (webhooks/tasks.py).
RETRY_SCHEDULE = {"name": "webhooks.deliver_due", "func": "webhooks.tasks.deliver_due", "minutes": 1}


class WebhooksConfig(AppConfig):
    name = "webhooks"
    label = "webhooks"
    verbose_name = "Webhooks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        schedules.every(self, **RETRY_SCHEDULE)
