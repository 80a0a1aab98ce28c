"""Live batch events over Channels: absolute snapshots, never deltas.

A group send to a full channel drops silently (channels-redis keeps 100
messages a channel), so every event carries the whole state: a dropped one
costs nothing. Workers coalesce to at most ~2 events a second per batch and
send from their own event loop.
"""

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from batches.models import Batch

logger = logging.getLogger("openrelay.events")

EVENT_TYPE = "batch.updated"
MIN_INTERVAL_S = 0.5


def batch_group(public_id):
    return f"batch.{public_id}"


def org_group(organization_id):
    return f"org.{organization_id}"


def snapshot(batch_pk):
    """The event for a batch, read now (sync; call from the DB thread)."""
    found = snapshots([batch_pk])
    return found[0] if found else None


def snapshots(batch_pks):
    """The events for several batches, in one query (an engine announces many batches a trip)."""
    from batches.presenters import live_batch_object, live_batches

    return [
        {"organization_id": batch.organization_id, "batch": live_batch_object(batch)}
        for batch in live_batches(Batch.objects.filter(pk__in=batch_pks))
    ]


async def send(event):
    layer = get_channel_layer()
    if layer is None or event is None:
        return
    message = {"type": EVENT_TYPE, "batch": event["batch"]}
    try:
        await layer.group_send(batch_group(event["batch"]["id"]), message)
        await layer.group_send(org_group(event["organization_id"]), message)
    except Exception:  # events are best effort; the database is the truth
        logger.warning("could not send a batch event", exc_info=True)


def batch_changed_sync(batch_pk):
    """Announce a status change from sync code (create, cancel, close); rare, so async_to_sync is fine."""
    async_to_sync(send)(snapshot(batch_pk))
