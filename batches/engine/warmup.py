"""What a worker's first batch would otherwise pay once, paid as its engine starts (issue 55, item 3).

A fresh cluster's first batch cost its workers 0.244 ms of CPU a record against
0.142-0.150 ms for the next identical ones. What a worker process did for the
first time inside it: import the S3 storage backend and boto3 for an isinstance
check (0.11-0.14 s, gone: files.storage.open_records), import channels-redis
with its serializers (~60 ms) and open the channel layer's Redis connection for
the batch's first live event. The engine does the last two here, before its
first heartbeat, so a cluster counts as started once they are paid. Nothing here
may stop an engine from starting: a warm-up that fails is logged and skipped
(the first batch pays instead).
"""

import logging

from channels.layers import get_channel_layer

logger = logging.getLogger("openrelay.engine")

# A group no socket ever joins: a send to it opens the layer's connection and reaches no one.
WARM_GROUP = "openrelay.warmup"


async def warm():
    try:
        from batches import presenters  # noqa: F401 - imported by the first live event otherwise (events.snapshots)

        layer = get_channel_layer()  # imports the layer's backend (channels-redis) and builds it
        if layer is not None:
            await layer.group_send(WARM_GROUP, {"type": "warmup"})
    except Exception:  # the first batch pays instead; the engine starts all the same
        logger.warning("the engine's warm-up failed", exc_info=True)
