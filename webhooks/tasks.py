"""django-q2 entry points for webhook deliveries (the work lives in services).

In a worker process neither task waits on an endpoint: each hands the deliveries to the
process's sender (webhooks.sender) and returns, so a q2 worker (and the sweeps queued behind
it) is never held by a user's server. Elsewhere (tests, a shell) they send inline.
"""

from django.conf import settings
from django.db.models import F, Q, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from webhooks import services
from webhooks.models import DeliveryStatus, WebhookDelivery

DUE_PER_SWEEP = 200
# One organization's share of a sweep: 200 due deliveries of one organization's dead endpoints
# must not keep another's retries out of every sweep.
DUE_PER_ORG = 20


def deliver(delivery_pk):
    if not settings.WORKER_PROCESS:
        return services.deliver_pk(delivery_pk)
    org_id = WebhookDelivery.objects.filter(pk=delivery_pk).values_list("endpoint__organization_id", flat=True).first()
    if org_id is None:
        return "gone"
    services.submit(org_id, delivery_pk, first_only=True)
    return "queued"


def deliver_due(now=None):
    """Send every pending delivery whose next attempt is due (first attempts nobody made, and retries):
    at most DUE_PER_ORG of one organization's a sweep, oldest first. Returns how many were sent or queued."""
    now = now or timezone.now()
    due = list(_due(now)[:DUE_PER_SWEEP])
    if settings.WORKER_PROCESS:
        return sum(services.submit(d.endpoint.organization_id, d.pk, first_only=False) for d in due)
    # services.deliver takes each one first: what another sender is sending now is skipped.
    return sum(services.deliver(delivery, now=now) != "taken" for delivery in due)


def _due(now):
    turn = Window(RowNumber(), partition_by=F("endpoint__organization_id"), order_by=F("next_attempt_at").asc())
    return (
        WebhookDelivery.objects.select_related("endpoint")
        .filter(status=DeliveryStatus.PENDING, next_attempt_at__lte=now)
        .filter(Q(sending_until__isnull=True) | Q(sending_until__lt=now))  # not being sent now
        .annotate(turn=turn)
        .filter(turn__lte=DUE_PER_ORG)
        .order_by("next_attempt_at")
    )
