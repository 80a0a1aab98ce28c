"""The one way an app registers a periodic q2 task: `every(app_config, name, func, minutes)` in its ready().

The Schedule row is written after every migrate, so it is idempotent and follows the code: a task whose
module moved, or whose period changed, has its row updated on the next `migrate` (`manage.py up` and
deployments run it at start), never duplicated. q2's scheduler (in every `qcluster`) then enqueues it.
"""

from django.apps import apps as global_apps
from django.db.models.signals import post_migrate


def every(app_config, *, name, func, minutes):
    """After each migrate of `app_config`, make the q2 Schedule `name` run `func` (a dotted path) every `minutes`."""

    def ensure(sender=None, using="default", apps=None, **kwargs):
        ensure_schedule(name=name, func=func, minutes=minutes, using=using, apps=apps)

    post_migrate.connect(ensure, sender=app_config, weak=False, dispatch_uid=f"openrelay.schedules.{name}")
    return ensure


def ensure_schedule(*, name, func, minutes, using="default", apps=None):
    # The migration state's models when migrate hands them over; flush sends post_migrate without them.
    apps = apps or global_apps
    try:
        Schedule = apps.get_model("django_q", "Schedule")
    except LookupError:  # django_q not migrated (yet) on this database
        return
    Schedule.objects.using(using).update_or_create(
        name=name,
        defaults={"func": func, "schedule_type": "I", "minutes": minutes, "repeats": -1},  # "I": Schedule.MINUTES
    )
