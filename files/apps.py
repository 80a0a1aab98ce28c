from django.apps import AppConfig

from openrelay.lib import schedules

# Deletes expired files and stale upload temp files (files/tasks.py).
EXPIRY_SCHEDULE = {"name": "files.delete_expired", "func": "files.tasks.delete_expired_files", "minutes": 10}


class FilesConfig(AppConfig):
    name = "files"

    def ready(self):
        schedules.every(self, **EXPIRY_SCHEDULE)
