"""The MessageBatch object as Anthropic's API shows it, from a batch.

Status: the batch's eight statuses are Anthropic's three (`in_progress`, `canceling`, `ended`).
Counts are live: Anthropic reports outcomes only once a batch has ended, we report them as
records finish (a superset its clients accept: the five still add up to every request). Lines
rejected at create are `errored`; records closed by a cancel or the expiry are `canceled` and
`expired` (counted with one query per page: `closed_counts`).
"""

from django.db.models import Count

from batches.models import BatchStatus, Record, RecordStatus

ID_PREFIX, BATCH_PREFIX = "msgbatch_", "batch_"
PROCESSING_STATUS = {
    BatchStatus.VALIDATING: "in_progress",
    BatchStatus.IN_PROGRESS: "in_progress",
    BatchStatus.FINALIZING: "in_progress",
    BatchStatus.CANCELLING: "canceling",
}
ENDED_AT = ("completed_at", "failed_at", "expired_at", "cancelled_at")


def message_batch_id(batch):
    return ID_PREFIX + batch.public_id.removeprefix(BATCH_PREFIX)


def batch_public_id(message_batch_id):
    """The batch id behind a MessageBatch id (a `batch_` id is taken as it is); None for anything else."""
    if message_batch_id.startswith(ID_PREFIX):
        return BATCH_PREFIX + message_batch_id.removeprefix(ID_PREFIX)
    return message_batch_id if message_batch_id.startswith(BATCH_PREFIX) else None


def results_path(batch):
    # Relative: Anthropic's SDK joins it to its base_url, which keeps any path prefix a proxy adds.
    return f"/v1/messages/batches/{message_batch_id(batch)}/results"


def closed_counts(batches):
    """{batch pk: {"cancelled": n, "expired": n}} for the ended batches among `batches`: one query."""
    ended = [b.pk for b in batches if b.is_terminal]
    counts = {pk: {} for pk in ended}
    if ended:
        rows = (
            Record.objects.filter(batch_id__in=ended, status__in=(RecordStatus.CANCELLED, RecordStatus.EXPIRED))
            .values("batch_id", "status")
            .annotate(n=Count("pk"))
            .order_by()
        )
        for row in rows:
            counts[row["batch_id"]][row["status"]] = row["n"]
    return counts


def rejected_count(batch):
    return sum(1 for error in batch.errors or () if error.get("line") is not None)


def request_counts(batch, closed):
    canceled, expired = closed.get(RecordStatus.CANCELLED, 0), closed.get(RecordStatus.EXPIRED, 0)
    finished = batch.completed_count + batch.failed_count
    return {
        "processing": max(0, batch.total_count - finished),
        "succeeded": batch.completed_count,
        "errored": batch.failed_count - canceled - expired + rejected_count(batch),
        "canceled": canceled,
        "expired": expired,
    }


def message_batch_object(batch, closed=None):
    """`closed`: the batch's entry of closed_counts (read here when not given)."""
    if closed is None:
        closed = closed_counts([batch]).get(batch.pk, {})
    ended = batch.is_terminal
    return {
        "id": message_batch_id(batch),
        "type": "message_batch",
        "processing_status": "ended" if ended else PROCESSING_STATUS[batch.status],
        "request_counts": request_counts(batch, closed),
        "ended_at": _rfc3339(next((getattr(batch, f) for f in ENDED_AT if getattr(batch, f)), None)) if ended else None,
        "created_at": _rfc3339(batch.created_at),
        "expires_at": _rfc3339(batch.expires_at),
        "archived_at": None,
        "cancel_initiated_at": _rfc3339(batch.cancelling_at),
        "results_url": results_path(batch) if ended else None,
    }


def _rfc3339(moment):
    return None if moment is None else moment.isoformat().replace("+00:00", "Z")
