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
        from django_q.signals import post_spawn

        from batches.engine import process

        post_migrate.connect(ensure_sweeper_schedule, sender=self)
        # Every q2 worker process runs an engine beside its tasks.
        post_spawn.connect(process.on_spawn, dispatch_uid="openrelay-engine")
