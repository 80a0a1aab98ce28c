"""Webhook endpoints (an organization's URLs for batch events) and their deliveries."""

import secrets

from django.db import models
from django.utils import timezone

from openrelay.core.models import Organization

# The events batches emit, by the terminal status that emits them.
BATCH_EVENTS = {
    "completed": "batch.completed",
    "failed": "batch.failed",
    "expired": "batch.expired",
    "cancelled": "batch.cancelled",
}
# A running batch paused (a guardrail or its owner) and resumed: batches.lifecycle.pause / resume.
PAUSE_EVENTS = ("batch.paused", "batch.resumed")
# Sent while a batch runs, once, when it is expected to finish past its window (batches/risk.py).
AT_RISK_EVENT = "batch.at_risk"
EVENT_TYPES = (*BATCH_EVENTS.values(), *PAUSE_EVENTS, AT_RISK_EVENT)


def new_endpoint_id():
    return "wh_" + secrets.token_hex(16)


def new_event_id():
    return "evt_" + secrets.token_hex(16)


class WebhookEndpointQuerySet(models.QuerySet):
    def for_org(self, organization):
        return self.filter(organization=organization)


class WebhookEndpoint(models.Model):
    """Where an organization wants batch events POSTed, and the secret that signs them."""

    public_id = models.CharField(max_length=40, unique=True, default=new_endpoint_id, editable=False)
    organization = models.ForeignKey(Organization, models.CASCADE, related_name="webhook_endpoints")
    name = models.CharField(max_length=200)
    url = models.CharField(max_length=2048)
    event_types = models.JSONField(default=list)
    # Needed in the clear to sign; shown once (create, rotate) and never again.
    signing_secret = models.CharField(max_length=100, editable=False)
    # After a rotation that keeps the old secret for 24 h, deliveries carry both signatures.
    previous_secret = models.CharField(max_length=100, blank=True, editable=False)
    previous_secret_until = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    objects = WebhookEndpointQuerySet.as_manager()

    class Meta:
        indexes = [models.Index(fields=["organization", "-created_at"])]

    def __str__(self):
        return f"{self.name} ({self.public_id})"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"  # not sent yet, or waiting for its next attempt
    DELIVERED = "delivered"
    FAILED = "failed"  # every attempt failed


class WebhookDelivery(models.Model):
    """One event for one endpoint: the exact payload, sent until a 2xx or out of attempts."""

    endpoint = models.ForeignKey(WebhookEndpoint, models.CASCADE, related_name="deliveries")
    event_id = models.CharField(max_length=40, default=new_event_id, editable=False)
    event_type = models.CharField(max_length=40)
    # The bytes that are signed and sent, every attempt the same (receivers dedupe on webhook-id).
    payload = models.TextField()
    status = models.CharField(max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    # Set while one sender (the finalizing worker, a task, a retry sweep) makes an attempt, so no other sends too.
    sending_until = models.DateTimeField(null=True, blank=True, editable=False)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "webhook deliveries"
        indexes = [models.Index(fields=["status", "next_attempt_at"])]

    def __str__(self):
        return f"{self.event_type} {self.event_id} -> {self.endpoint_id}"
