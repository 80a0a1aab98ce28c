"""The records a closed batch cuts short: marked expired or cancelled, and what each is billed.

A record cut mid-way is billed what its checkpoint says its answers came to
(workflow and contract records), or counts them as unbilled usage (tool-calling
records); any other unfinished record bills nothing. batches.engine.finish calls
these when it expires or cancels a batch.
"""

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from batches.engine.checkpoints import decode, usage_from
from batches.engine.store import lock_batches
from batches.models import Batch, Record, RecordStatus

# A twin waiting for its leader (batches.reuse) is cut with it: it never ran.
_UNFINISHED = (RecordStatus.PENDING, RecordStatus.WAITING, RecordStatus.RUNNING)


def unfinished_count(batch_pk):
    return Record.objects.filter(batch_id=batch_pk, status__in=_UNFINISHED).count()


def close_unfinished(batch_pk, status, code, message):
    """Mark every pending/running record of the batch as `status` (expired/cancelled).

    Counted as failed: they are error-file lines. A record cut mid-way keeps
    what its checkpoint says its answers came to (_close_checkpointed): a
    workflow record is billed the requests that succeeded (workflows.md) and a
    contract record the answers it got, each saying so in its error message; a
    tool-calling record's turns are unbilled usage (batch-api.txt), counted
    against the budget. Any other unfinished record bills nothing.
    """
    now = timezone.now()
    unfinished = Record.objects.filter(batch_id=batch_pk, status__in=_UNFINISHED)
    with transaction.atomic():
        lock_batches([batch_pk])  # before the records: the order flushes keep
        billed = _close_checkpointed(batch_pk, unfinished, status, code, message, now)
        closed = unfinished.update(
            status=status,
            error_code=code,
            error_message=message,
            finished_at=now,
            lease_owner="",
            lease_expires_at=None,
            checkpoint=None,
        )
        closed += billed
        if closed:
            Batch.objects.filter(pk=batch_pk).update(failed_count=F("failed_count") + closed)
    return closed


# A cut record's checkpoint usage goes to these Record columns, and is added to these Batch totals.
_BILLED = (
    ("prompt_tokens", "input_tokens"),
    ("cached_tokens", "cached_tokens"),
    ("completion_tokens", "output_tokens"),
    ("reasoning_tokens", "reasoning_tokens"),
)
_UNBILLED = (
    ("unbilled_prompt_tokens", "unbilled_input_tokens"),
    ("unbilled_cached_tokens", "unbilled_cached_tokens"),
    ("unbilled_completion_tokens", "unbilled_output_tokens"),
)


def _close_checkpointed(batch_pk, unfinished, status, code, message, now):
    """Close the unfinished records that carry a checkpoint with usage (workflow, contract and
    tool-calling records), each with that usage, and add it to the batch. Returns how many it closed.

    The running records are locked first (SKIP LOCKED claims pass them by; a
    checkpoint write waits, then finds the record no longer running), so no
    checkpoint lands between reading it and closing the record.
    """
    rows = list(
        unfinished.select_for_update()
        .filter(Q(status=RecordStatus.RUNNING) | Q(checkpoint__isnull=False))
        .values_list("pk", "checkpoint")
    )
    totals = dict.fromkeys((total for _, total in _BILLED + _UNBILLED), 0)
    closed = 0
    for pk, blob in rows:
        state = decode(blob) if blob is not None else None
        kind = state.get("kind") if state else None
        if kind not in ("workflow", "contract", "tools"):
            continue
        usage = usage_from(state.get("usage"))
        values = (usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens, usage.reasoning_tokens)
        columns = _UNBILLED if kind == "tools" else _BILLED
        fields = {column: value for (column, _), value in zip(columns, values)}
        Record.objects.filter(pk=pk).update(
            status=status,
            error_code=code,
            error_message=message + _cut_progress(kind, state, usage),
            finished_at=now,
            lease_owner="",
            lease_expires_at=None,
            checkpoint=None,
            **fields,
        )
        for (_, total), value in zip(columns, values):
            totals[total] += value
        closed += 1
    if closed:
        Batch.objects.filter(pk=batch_pk).update(**{total: F(total) + value for total, value in totals.items()})
    return closed


def _cut_progress(kind, state, usage):
    """What a cut record's error message adds: how far it got, and what of it is billed."""
    if kind == "workflow":
        return (
            f" The workflow had reached step {state['steps']} and sent {state['requests']} requests; "
            f"{usage.total_tokens} tokens of the requests that succeeded are billed."
        )
    if kind == "contract":
        reasks = state.get("reasks", 0)
        answers = f"{reasks} answer{'s' if reasks != 1 else ''}"
        return f" It had made {reasks} re-ask{'s' if reasks != 1 else ''}; {usage.total_tokens} tokens of its {answers} are billed."
    return ""
