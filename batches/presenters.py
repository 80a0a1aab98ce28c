"""The Batch object as the API shows it (OpenAI's shape plus OpenRelay's `priority`).

Shared by the API, the dashboard and the CLI. Load batches with
`select_related("output_file", "error_file")` (see PRESENTER_RELATED) so a
list costs one query.
"""

from batches import latency
from batches.risk import expected_completion
from billing.pricing import batch_cost, unbilled_cost, usd
from openrelay.api.timestamps import BATCH_TIMESTAMPS

PRESENTER_RELATED = ("output_file", "error_file")


def live_batches(queryset):
    """Batches for live snapshots (events, dashboard sockets): the create-time
    rejections (up to 50,000 entries, never changing) are neither read nor sent,
    nor the progress samples (up to ~3 KB; the Batch object does not carry them)."""
    return queryset.select_related(*PRESENTER_RELATED).defer("errors", "progress")


def live_batch_object(batch):
    """The Batch object without `errors`, for a batch loaded through live_batches."""
    return _batch_object(batch, errors=None)


def batch_object(batch):
    return _batch_object(batch, {"object": "list", "data": batch.errors} if batch.errors else None)


def _batch_object(batch, errors):
    return {
        "id": batch.public_id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "model": batch.model_name or None,
        "errors": errors,
        "input_file_id": batch.input_file_public_id,
        "completion_window": batch.completion_window,
        "status": batch.status,
        "output_file_id": batch.output_file.public_id if batch.output_file_id else None,
        "error_file_id": batch.error_file.public_id if batch.error_file_id else None,
        **{name: _unix(getattr(batch, name)) for name in BATCH_TIMESTAMPS},
        "request_counts": {
            "total": batch.total_count,
            "completed": batch.completed_count,
            "failed": batch.failed_count,
        },
        "metadata": batch.metadata,
        "usage": usage_object(batch),
        "priority": batch.priority,
        "openrelay": {
            # Records whose server-reported usage cannot be right: billed as reported, counted here.
            "implausible_usage": batch.implausible_usage_count,
            # Tokens of answers its records got but are not billed for (docs/concepts/billing.md):
            # counted against its max_cost and the monthly budget; null until there are any.
            "unbilled_usage": unbilled_usage_object(batch),
            # What its billed tokens cost so far, at the prices snapshotted at create: null until any token
            # was counted. Beside `usage`, not in it: OpenAI's usage has five fields, and clients parse it so.
            "cost": cost_object(batch),
            # Its quote's verdict at create (batches.estimate.admission): whether it fits its window given
            # what was queued on its model, and a warning when it does not; null when none was judged.
            "admission": batch.admission,
            # While it runs: when it is expected to finish, at its last minute's pace (the dashboard's ETA).
            "expected_completion_at": _unix(expected_completion(batch)),
            # Published latency (batches.latency): seconds from create until its first record ended
            # (succeeded or failed), and until it completed; null until known.
            "time_to_first_result": latency.time_to_first_result(batch),
            "time_to_complete": latency.time_to_complete(batch),
            # Guardrails (batches.guardrails): why and since when it is paused, its cap, its breaker.
            "paused": paused_object(batch),
            "max_cost": usd(batch.max_cost_nanos) if batch.max_cost_nanos is not None else None,
            "breaker": {
                "window": batch.breaker_window,
                "failures": batch.breaker_failures,
                "consecutive": batch.breaker_consecutive,
            },
            # Output contracts (docs/guides/output-contracts.md): records re-asked, re-asks made,
            # and records still invalid after their last re-ask (in the error file as invalid_output).
            "output_contracts": {
                "reasked": batch.reasked_count,
                "reasks": batch.reasks_count,
                "invalid_output": batch.invalid_output_count,
            },
            "reuse": reuse_object(batch),
        },
    }


def reuse_object(batch):
    """What reuse did for the batch (docs/guides/reuse.md): its mode; its twins (records whose request
    another of its records runs); the lines answered with a reused answer so far (twins settled,
    answers from the organization's cache), of which from the cache; and the tokens those answers did
    not cost (their originals' tokens, less what OPENRELAY_REUSE_BILL_SHARE bills)."""
    return {
        "mode": batch.reuse,
        "twins": batch.twin_count,
        "reused": batch.reused_count,
        "cache_hits": batch.cache_hit_count,
        "saved_input_tokens": batch.reused_input_tokens,
        "saved_output_tokens": batch.reused_output_tokens,
    }


def paused_object(batch):
    """{reason, since, message, code?, line?, example?} while the batch is paused, else None.

    Its status stays in_progress (or validating): the window clock runs on."""
    if not batch.is_paused:
        return None
    return {"reason": batch.pause_reason, "since": _unix(batch.paused_at), **(batch.pause_detail or {})}


def usage_object(batch):
    """OpenAI's batch usage, its five fields and nothing else, or None until any token was counted.

    Clients parse it with OpenAI's model (litellm's `Usage` reads a `cost` as a float): the cost is
    `openrelay.cost` (cost_object).
    """
    if batch.input_tokens + batch.output_tokens <= 0:
        return None
    return {
        "input_tokens": batch.input_tokens,
        "input_tokens_details": {"cached_tokens": batch.cached_tokens},
        "output_tokens": batch.output_tokens,
        "output_tokens_details": {"reasoning_tokens": batch.reasoning_tokens},
        "total_tokens": batch.input_tokens + batch.output_tokens,
    }


def cost_object(batch):
    """The batch's cost so far, {currency, input, cached_input, output, total}, or None until any token was counted.

    It comes from the live counters at the prices snapshotted at create, so it rises as records finish
    and ends equal to the ledger entry.
    """
    if batch.input_tokens + batch.output_tokens <= 0:
        return None
    return batch_cost(batch).as_object()


def unbilled_usage_object(batch):
    """The usage object's shape (no reasoning detail) for the batch's unbilled tokens, its cost
    what they count against max_cost and the budget (never charged), or None while there are none."""
    if batch.unbilled_input_tokens + batch.unbilled_output_tokens <= 0:
        return None
    return {
        "input_tokens": batch.unbilled_input_tokens,
        "input_tokens_details": {"cached_tokens": batch.unbilled_cached_tokens},
        "output_tokens": batch.unbilled_output_tokens,
        "total_tokens": batch.unbilled_input_tokens + batch.unbilled_output_tokens,
        "cost": unbilled_cost(batch).as_object(),
    }


def _unix(moment):
    return int(moment.timestamp()) if moment is not None else None
