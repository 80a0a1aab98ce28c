from django.apps import AppConfig

from openrelay.lib import schedules

# The safety net that closes what no engine closed (batches/engine/sweeper.py).
SWEEPER_SCHEDULE = {"name": "batches.sweep", "func": "batches.tasks.sweep", "minutes": 1}
# batch.at_risk: a running batch newly expected to finish past its window (batches/risk.py).
AT_RISK_SCHEDULE = {"name": "batches.at_risk", "func": "batches.tasks.warn_at_risk", "minutes": 1}


class BatchesConfig(AppConfig):
    name = "batches"

    def ready(self):
        from django.db.models.signals import post_delete
        from django_q.signals import post_spawn

        from batches import endpoints
        from batches.engine import process
        from batches.estimate import counted
        from openrelay.web import dialects

        # The web layer answers each dialect's routes in its shapes (openrelay/web/dialects.py).
        for dialect in endpoints.DIALECTS:
            dialects.register(dialect)
        schedules.every(self, **SWEEPER_SCHEDULE)
        schedules.every(self, **AT_RISK_SCHEDULE)
        # Every q2 worker process runs an engine beside its tasks.
        post_spawn.connect(process.on_spawn, dispatch_uid="openrelay-engine")
        # A quote's kept tokenizer counts go with their file (batches/estimate/counted.py).
        post_delete.connect(counted.file_deleted, sender="files.File", dispatch_uid="openrelay-quote-counts")
