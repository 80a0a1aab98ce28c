"""The organization's own history on a model and endpoint: the output tokens and tool rounds of its past records.

Read from the records of its most recent batches on the model and endpoint
(their succeeded records: a failed one billed no output), newest first, so
a quote follows how the organization's prompts answer now.
"""

import statistics
from dataclasses import dataclass

import orjson

from batches.models import Batch, Record, RecordStatus

# A record's output tokens when the organization has no history on the model: a guess, said to be one.
DEFAULT_OUTPUT_TOKENS = 256
HISTORY_BATCHES = 50
HISTORY_RECORDS = 2000
TOOL_HISTORY_RECORDS = 200


@dataclass
class OutputHistory:
    records: int = 0
    low: float = 0.0  # 10th percentile of a record's output tokens
    mean: float = 0.0
    high: float = 0.0  # 90th percentile
    tool_records: int = 0
    tool_rounds: float | None = None  # mean rounds of its tool-calling records


def output_history(organization, model_id, endpoint):
    batch_pks = list(
        Batch.objects.filter(organization=organization, model_id=model_id, endpoint=endpoint)
        .order_by("-pk")
        .values_list("pk", flat=True)[:HISTORY_BATCHES]
    )
    if not batch_pks:
        return OutputHistory()
    tokens = _recent_output_tokens(batch_pks)
    history = OutputHistory()
    if tokens:
        history.records, history.mean = len(tokens), statistics.fmean(tokens)
        history.low, history.high = _percentiles(tokens)
    rounds = _tool_rounds(Record.objects.filter(batch_id__in=batch_pks[:5], status=RecordStatus.SUCCEEDED))
    if rounds:
        history.tool_records, history.tool_rounds = len(rounds), statistics.fmean(rounds)
    return history


def _recent_output_tokens(batch_pks):
    """Output tokens of the newest HISTORY_RECORDS succeeded records, a batch at a time, newest first:
    each query is one range of the (batch, status, line) index, where one query over every batch
    sorted all their succeeded records (up to 2.5 million) to keep 2,000."""
    tokens = []
    for batch_pk in batch_pks:
        wanted = HISTORY_RECORDS - len(tokens)
        if wanted <= 0:
            break
        succeeded = Record.objects.filter(batch_id=batch_pk, status=RecordStatus.SUCCEEDED).order_by("-line")
        tokens += succeeded.values_list("completion_tokens", flat=True)[:wanted]
    return tokens


def _percentiles(values):
    if len(values) == 1:
        return values[0], values[0]
    cuts = statistics.quantiles(values, n=10, method="inclusive")
    return cuts[0], cuts[-1]


def _tool_rounds(records):
    # A tool-calling record's result says its rounds (batches.engine.loops.toolloop): only those mention it.
    bodies = records.filter(response_body__contains='"tool_rounds"').values_list("response_body", flat=True)
    rounds = []
    for body in bodies[:TOOL_HISTORY_RECORDS]:
        try:
            value = (orjson.loads(body).get("openrelay") or {}).get("tool_rounds")
        except (orjson.JSONDecodeError, AttributeError):
            continue
        if isinstance(value, int):
            rounds.append(value)
    return rounds
