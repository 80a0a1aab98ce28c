from django.db import models
from django.utils import timezone

from openrelay.core.models import Organization
from openrelay.lib.ids import new_file_id


class Purpose(models.TextChoices):
    BATCH = "batch"
    BATCH_OUTPUT = "batch_output"


class FileQuerySet(models.QuerySet):
    def for_org(self, organization):
        return self.filter(organization=organization)

    def live(self, now=None):
        now = now or timezone.now()
        return self.filter(models.Q(expires_at__isnull=True) | models.Q(expires_at__gt=now))


class File(models.Model):
    public_id = models.CharField(max_length=40, unique=True, default=new_file_id, editable=False)
    organization = models.ForeignKey(Organization, models.CASCADE, related_name="files")
    filename = models.CharField(max_length=255)
    purpose = models.CharField(max_length=32, choices=Purpose.choices)
    bytes = models.BigIntegerField(default=0)
    # Name of the stored object in Django's default storage.
    storage_name = models.CharField(max_length=500)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)
    # How many unfinished batches read this file; a pinned file can't be deleted
    # (records point into it by byte offset).
    pins = models.PositiveIntegerField(default=0)

    objects = FileQuerySet.as_manager()

    class Meta:
        indexes = [models.Index(fields=["organization", "-created_at"]), models.Index(fields=["expires_at"])]

    def __str__(self):
        return self.public_id
