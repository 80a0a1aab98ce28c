"""django-q2 entry points for webhook deliveries (the work lives in services)."""

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from openrelay.webhooks import services
from openrelay.webhooks.models import DeliveryStatus, WebhookDelivery

DUE_PER_SWEEP = 200


def deliver(delivery_pk):
    delivery = WebhookDelivery.objects.select_related("endpoint").filter(pk=delivery_pk).first()
    if delivery is None:
        return "gone"  # its endpoint was deleted
    return services.deliver(delivery)


def deliver_due(now=None):
    """Send every pending delivery whose next attempt is due (first attempts a lost task never made, and retries)."""
    now = now or timezone.now()
    due = (WebhookDelivery.objects.select_related("endpoint")
           .filter(status=DeliveryStatus.PENDING, next_attempt_at__lte=now).order_by("next_attempt_at"))
    sent = 0
    for delivery in due[:DUE_PER_SWEEP]:
        # Take the delivery first (push its next attempt past this one's
        # timeout): a sweep that overlaps this one skips it instead of
        # sending the event a second time.
        lease = now + timedelta(seconds=2 * settings.OPENRELAY_WEBHOOK_TIMEOUT_S + 60)
        if WebhookDelivery.objects.filter(pk=delivery.pk, status=DeliveryStatus.PENDING,
                                          next_attempt_at=delivery.next_attempt_at).update(next_attempt_at=lease):
            services.deliver(delivery, now=now)
            sent += 1
    return sent
