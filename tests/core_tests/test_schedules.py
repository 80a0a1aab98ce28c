"""The q2 schedules every app registers through openrelay.lib.schedules: there after migrate, once each,
and corrected by the next migrate when the code moved a task or changed its period."""

import pytest
from django.core.management.sql import emit_post_migrate_signal
from django_q.models import Schedule

from batches.apps import AT_RISK_SCHEDULE, SWEEPER_SCHEDULE
from files.apps import EXPIRY_SCHEDULE
from webhooks.apps import RETRY_SCHEDULE

SCHEDULES = [SWEEPER_SCHEDULE, AT_RISK_SCHEDULE, EXPIRY_SCHEDULE, RETRY_SCHEDULE]

pytestmark = pytest.mark.django_db


def _rows():
    return {s.name: (s.func, s.schedule_type, s.minutes, s.repeats) for s in Schedule.objects.all()}


def _migrated():
    # What `migrate` sends once it has applied the migrations: every app's post_migrate handlers.
    emit_post_migrate_signal(verbosity=0, interactive=False, db="default")


def test_every_app_schedule_exists_after_migrate():
    assert _rows() == {s["name"]: (s["func"], Schedule.MINUTES, s["minutes"], -1) for s in SCHEDULES}
    assert _rows()["batches.sweep"] == ("batches.tasks.sweep", Schedule.MINUTES, 1, -1)
    assert _rows()["files.delete_expired"] == ("files.tasks.delete_expired_files", Schedule.MINUTES, 10, -1)
    assert _rows()["webhooks.deliver_due"] == ("webhooks.tasks.deliver_due", Schedule.MINUTES, 1, -1)


def test_a_second_migrate_creates_nothing_more():
    _migrated()
    _migrated()
    assert Schedule.objects.count() == len(SCHEDULES)


def test_a_row_left_by_older_code_is_corrected_by_the_next_migrate():
    # The webhooks app lived in openrelay/ before: its row named openrelay.webhooks.tasks.deliver_due,
    # which no worker can import any more.
    Schedule.objects.filter(name="webhooks.deliver_due").update(func="openrelay.webhooks.tasks.deliver_due", minutes=7)
    Schedule.objects.filter(name="files.delete_expired").delete()
    _migrated()
    assert _rows()["webhooks.deliver_due"] == ("webhooks.tasks.deliver_due", Schedule.MINUTES, 1, -1)
    assert _rows()["files.delete_expired"] == ("files.tasks.delete_expired_files", Schedule.MINUTES, 10, -1)


def test_every_scheduled_func_imports():
    from django.utils.module_loading import import_string

    for schedule in SCHEDULES:
        assert callable(import_string(schedule["func"]))
