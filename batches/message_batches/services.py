"""Message Batch writes: create (the requests -> a `/v1/messages` batch), cancel and delete."""

from django.db import transaction

from batches import services
from batches.estimate import admission as admissions
from batches.message_batches.params import MAX_REQUESTS, MESSAGES, check_params
from batches.message_batches.presenters import message_batch_id
from batches.models import Batch
from batches.validation.messages import Catalog
from batches.validation.params import CreateParams
from files import services as files
from openrelay.api.errors import ApiError
from openrelay.core.models import Model


def create_message_batch(*, organization, lines, completion_window=None, admission="warn"):
    """A batch of Messages requests (lines from params.parse_requests). Its rejected lines keep their custom_id,
    so the results can name them. A request whose params Anthropic would refuse is a 400 before anything is stored."""
    check_params(lines, Catalog(dict(Model.objects.filter(enabled=True).values_list("name", "max_output_tokens"))))
    params = CreateParams(endpoint=MESSAGES, requests=lines, completion_window=completion_window, admission=admission)
    batch = services.create_batch(
        organization=organization,
        params=params,
        max_records=MAX_REQUESTS,
        admit=admissions.judge(organization=organization, params=params),
    )
    if batch.errors:
        for error in batch.errors:
            line = error.get("line")
            if line is not None and 1 <= line <= len(lines):
                error["custom_id"] = lines[line - 1]["custom_id"]
        Batch.objects.filter(pk=batch.pk).update(errors=batch.errors)
    return batch


def cancel_message_batch(batch):
    """Cancel a running batch; an ended one is answered as it is (there is nothing left to cancel)."""
    if batch.is_terminal:
        return batch
    return services.cancel_batch(batch)


def delete_message_batch(batch):
    """Delete an ended batch: its row, its records and its files (input and results). The ledger keeps its
    entry (billing.models.LedgerEntry names the batch by id, it holds no key to it)."""
    if not batch.is_terminal:
        raise ApiError(
            f"Message Batch {message_batch_id(batch)} is still processing and cannot be "
            "deleted; cancel it first, then delete it once it has ended.",
            code="batch_not_ended",
        )
    with transaction.atomic():
        for file in (batch.input_file, batch.output_file, batch.error_file):
            if file is not None:
                files.delete_file(file)
        batch.records.all().delete()
        batch.delete()
