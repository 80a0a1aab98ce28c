from django.apps import AppConfig
from django.db.models.signals import post_migrate


def ensure_sweeper_schedule(**kwargs):
    """Register the sweeper once (idempotent; runs after every migrate)."""
    from django_q.models import Schedule

    Schedule.objects.update_or_create(
        name="batches.sweep",
        defaults={"func": "batches.tasks.sweep", "schedule_type": Schedule.MINUTES, "minutes": 1, "repeats": -1},
    )


class BatchesConfig(AppConfig):
    name = "batches"

    def ready(self):
        post_migrate.connect(ensure_sweeper_schedule, sender=self)
