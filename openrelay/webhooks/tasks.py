"""django-q2 entry points for webhook deliveries (the work lives in services)."""

from django.utils import timezone

from openrelay.webhooks import services
from openrelay.webhooks.models import DeliveryStatus, WebhookDelivery

DUE_PER_SWEEP = 500


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
        services.deliver(delivery)
        sent += 1
    return sent
