"""django-q2 entry points for webhook deliveries (the work lives in services)."""

from django.utils import timezone

from webhooks import services
from webhooks.models import DeliveryStatus, WebhookDelivery

DUE_PER_SWEEP = 200


def deliver(delivery_pk):
    return services.deliver_pk(delivery_pk)


def deliver_due(now=None):
    """Send every pending delivery whose next attempt is due (first attempts nobody made, and retries)."""
    now = now or timezone.now()
    due = (
        WebhookDelivery.objects.select_related("endpoint")
        .filter(status=DeliveryStatus.PENDING, next_attempt_at__lte=now)
        .order_by("next_attempt_at")
    )
    # services.deliver takes each one first: what another sender is sending now is skipped.
    return sum(services.deliver(delivery, now=now) != "taken" for delivery in due[:DUE_PER_SWEEP])
