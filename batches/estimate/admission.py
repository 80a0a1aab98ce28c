"""Admission at create: can the batch finish in its window, given what is queued on its model?

The quote's own figures answer it (batches.estimate.pace: the model's measured
pace, the batches queued on it, shared as the engines share it; the
organization's output history), once create's scan has counted the records.
The input is not read a second time: its tokens are approximated from the
accepted lines' bytes (4 characters a token, the quote's approximation; the
lines' JSON keys make it an overestimate, so admission errs towards "late").

A batch that does not fit (its expected duration past its window) is accepted
with a warning on the batch object and the `batch.at_risk` event (default), or
refused with a 400 `window_cannot_be_met` when the create asks for
`"openrelay": {"admission": "strict"}`. When nothing measures the model's
pace yet, the time can't be told and every batch is admitted.
"""

from datetime import timedelta

from django.utils import timezone

from batches import endpoints, windows
from batches.estimate import history as histories
from batches.estimate import pace as paces
from batches.estimate.records import CHARS_PER_TOKEN
from openrelay.api.errors import ApiError

STRICT = "strict"  # of batches.validation.params.ADMISSIONS
CODE = "window_cannot_be_met"


def judge(*, organization, params, now=None):
    """The `admit` create_batch calls after its scan: (model pk, ScanResult) -> the batch's admission
    (stored on it, shown in its OpenRelay fields), or ApiError (400) when strict and it can't fit."""

    window = windows.parse(params.completion_window) if params.completion_window else windows.default()

    def admit(model_pk, result):
        verdict = _verdict(
            organization, params.endpoint, params.priority, window, model_pk, result, now or timezone.now()
        )
        if params.admission == STRICT and verdict["fits_window"] is False:
            raise ApiError(
                f"This batch is expected to take {verdict['expected_duration_s']:,.0f} s on its model, given what "
                f"is queued on it, past its {window.name} window: it was not created (strict admission). "
                "Choose a longer window, split the batch, or create it without strict admission to run it anyway.",
                param="completion_window",
                code=CODE,
            )
        return verdict

    return admit


def _verdict(organization, endpoint, priority, window, model_pk, result, now):
    records = result.accepted
    per_record = _output_per_record(organization, model_pk, endpoint)
    input_tokens = result.accepted_bytes / CHARS_PER_TOKEN
    work = {name: paces.units(input_tokens, figure * records) for name, figure in per_record.items()}
    pace = paces.model_pace(model_pk, now, work["expected"] / records)
    durations = {
        name: paces.finish_after(pace, organization.pk, priority == "expedited", units, window.seconds)
        for name, units in work.items()
    }
    expected = durations["expected"]
    fits = paces.fits(durations, window.seconds)
    return {
        "fits_window": fits,
        "expected_duration_s": None if expected is None else round(expected, 1),
        "expected_completion_at": None if expected is None else int((now + timedelta(seconds=expected)).timestamp()),
        "basis": pace.basis,
        "queued_records": pace.queued_records,
        "warning": _warning(window, expected) if fits is False else None,
    }


def _output_per_record(organization, model_pk, endpoint):
    if not endpoints.get(endpoint).answers_tokens:
        return {"low": 0, "expected": 0, "high": 0}
    history = histories.output_history(organization, model_pk, endpoint)
    if history.records:
        return {"low": history.low, "expected": history.mean, "high": history.high}
    default = histories.DEFAULT_OUTPUT_TOKENS
    return {"low": 1, "expected": default, "high": 4 * default}


def _warning(window, expected):
    return (
        f"Expected to take {expected:,.0f} s given what is queued on its model, past its {window.name} window: "
        "records not run by expires_at will end batch_expired."
    )
