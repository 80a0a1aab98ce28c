"""The control-plane usage endpoint: the caller's billed totals by day and model, and beside them
the tokens its records got unbilled (counted against the budget, never charged)."""

import re
from datetime import date, timedelta

from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from billing import ledger
from billing.pricing import CURRENCY, usd
from openrelay.api import openapi
from openrelay.api.errors import ApiError

DEFAULT_DAYS = 30
MAX_DAYS = 366
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")

# The shapes, stated for the OpenAPI schema (the view builds its JSON by hand).
_AMOUNT = {"type": "string", "pattern": r"^\d+\.\d{9}$", "description": "USD, exact to the nano-dollar"}
_COST = {
    "type": "object",
    "required": ["currency", "input", "cached_input", "output", "total"],
    "properties": {
        "currency": {"type": "string", "enum": ["USD"]},
        "input": _AMOUNT,
        "cached_input": _AMOUNT,
        "output": _AMOUNT,
        "total": _AMOUNT,
    },
}
_TOKENS = {name: {"type": "integer"} for name in ("input_tokens", "cached_tokens", "output_tokens", "total_tokens")}
_UNBILLED = {
    "type": "object",
    "description": "Tokens of answers the batches' records got but were not billed for (a tool-calling record "
    "that failed mid-loop). Never charged; `cost` is what they came to at the batches' prices, counted "
    "against the monthly budget.",
    "required": [*_TOKENS, "cost"],
    "properties": {
        **_TOKENS,
        "cost": {
            "type": "object",
            "required": ["currency", "total"],
            "properties": {"currency": {"type": "string", "enum": ["USD"]}, "total": _AMOUNT},
        },
    },
}
_TOTALS = {"batches": {"type": "integer"}} | _TOKENS | {"cost": _COST, "unbilled": _UNBILLED}
_ROW = {
    "type": "object",
    "required": ["date", "model", *_TOTALS],
    "properties": {"date": {"type": "string", "format": "date"}, "model": {"type": "string"}, **_TOTALS},
}
USAGE_SCHEMA = {
    "type": "object",
    "required": ["object", "start", "end", "data", "total"],
    "properties": {
        "object": {"type": "string", "enum": ["organization.usage"]},
        "start": {"type": "string", "format": "date"},
        "end": {"type": "string", "format": "date"},
        "data": {"type": "array", "items": _ROW},
        "total": {"type": "object", "required": list(_TOTALS), "properties": _TOTALS},
    },
}


class UsageView(APIView):
    @extend_schema(
        operation_id="organization_usage",
        summary="The organization's billed usage by day and model",
        parameters=[
            OpenApiParameter(
                "start",
                OpenApiTypes.DATE,
                OpenApiParameter.QUERY,
                description="First day (UTC, YYYY-MM-DD, included); default 29 days before end.",
            ),
            OpenApiParameter(
                "end",
                OpenApiTypes.DATE,
                OpenApiParameter.QUERY,
                description="Last day (UTC, YYYY-MM-DD, included); default today.",
            ),
        ],
        responses={
            200: USAGE_SCHEMA,
            **openapi.errors(400, 401),
        },
    )
    def get(self, request):
        start, end = _parse_range(request.query_params)
        rows = ledger.totals_by_day_and_model(request.user.organization, start, end)
        return Response(
            {
                "object": "organization.usage",
                "start": start.isoformat(),
                "end": end.isoformat(),
                "data": [{"date": row["day"].isoformat(), "model": row["model_name"], **_amounts(row)} for row in rows],
                "total": _amounts(ledger.grand_total(rows)),
            }
        )


def _amounts(row):
    return {
        "batches": row["batches"],
        "input_tokens": row["input_tokens"],
        "cached_tokens": row["cached_tokens"],
        "output_tokens": row["output_tokens"],
        "total_tokens": row["input_tokens"] + row["output_tokens"],
        "cost": row["cost"].as_object(),
        "unbilled": {
            "input_tokens": row["unbilled_input_tokens"],
            "cached_tokens": row["unbilled_cached_tokens"],
            "output_tokens": row["unbilled_output_tokens"],
            "total_tokens": row["unbilled_input_tokens"] + row["unbilled_output_tokens"],
            "cost": _unbilled_cost(row["unbilled_cost_nanos"]),
        },
    }


def _unbilled_cost(total_nanos):
    # The ledger keeps only the total of what unbilled tokens came to; the parts stay unsplit.
    return {"currency": CURRENCY, "total": usd(total_nanos)}


def _parse_range(params):
    """(start, end) dates, both included: end defaults to today (UTC), start to 29 days before end."""
    end = _parse_date(params, "end") or timezone.now().date()
    start = _parse_date(params, "start") or _days_before(end, DEFAULT_DAYS - 1)
    if start > end:
        raise ApiError(
            f"Invalid 'start': {start.isoformat()} is after 'end' ({end.isoformat()}).",
            param="start",
            code="invalid_value",
        )
    if (end - start).days + 1 > MAX_DAYS:
        raise ApiError(
            f"Invalid 'start': the range covers {(end - start).days + 1} days; at most {MAX_DAYS} are allowed.",
            param="start",
            code="invalid_value",
        )
    return start, end


def _days_before(day, days):
    try:
        return day - timedelta(days=days)
    except OverflowError:  # an `end` in January of year 1
        return date.min


def _parse_date(params, name):
    raw = params.get(name)
    if raw is None:  # `?start=` is a value (not a date), not an absent parameter
        return None
    try:
        # fromisoformat alone also takes "20261201" and week dates; the API promises YYYY-MM-DD.
        if not _DATE.fullmatch(raw):
            raise ValueError
        return date.fromisoformat(raw)
    except ValueError:
        raise ApiError(
            f"Invalid '{name}': expected a date as YYYY-MM-DD, but got {raw!r} instead.",
            param=name,
            code="invalid_value",
        ) from None
