from django.apps import AppConfig
from django.apps import apps as global_apps
from django.db.models.signals import post_migrate

EXPIRY_SCHEDULE_NAME = "files.delete_expired"
EXPIRY_SCHEDULE_MINUTES = 10


def ensure_expiry_schedule(sender, app_config=None, using="default", apps=None, **kwargs):
    """Create the periodic expiry sweep if it is missing; runs after every migrate, so it is idempotent."""
    apps = apps or global_apps  # flush sends post_migrate without a migration state
    try:
        Schedule = apps.get_model("django_q", "Schedule")
    except LookupError:  # django_q not migrated (yet) on this database
        return
    Schedule.objects.using(using).get_or_create(
        name=EXPIRY_SCHEDULE_NAME,
        defaults={"func": "files.tasks.delete_expired_files", "schedule_type": "I", "minutes": EXPIRY_SCHEDULE_MINUTES},
    )


class FilesConfig(AppConfig):
    name = "files"

    def ready(self):
        post_migrate.connect(ensure_expiry_schedule, sender=self, dispatch_uid="files.ensure_expiry_schedule")
