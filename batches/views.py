"""The Batches API: thin views over batches.services and batches.presenters."""

import orjson
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from batches import catalog, endpoints, guardrails, results, services, windows
from batches.estimate import admission
from batches.estimate import quote as quotes
from batches.models import Batch
from batches.presenters import PRESENTER_RELATED, batch_object
from batches.validation.params import parse_create_params, parse_max_cost
from files.responses import stream_response, stream_size
from openrelay.api import openapi
from openrelay.api.errors import ApiError, NotFound
from openrelay.api.negotiation import IgnoreAcceptNegotiation
from openrelay.api.pagination import newest_first_page
from openrelay.api.params import request_object
from openrelay.api.parsers import json_body
from openrelay.api.throttles import BatchCreateThrottle, BatchEstimateThrottle
from openrelay.core import idempotency


def endpoint_enum(result, generator, request, public):
    """drf-spectacular postprocessing hook: the endpoints a batch may name are the registry's, so a new
    endpoint shows in the OpenAPI document without an edit there; the windows are the operator's."""
    create = result.get("components", {}).get("schemas", {}).get("BatchCreate")
    if create:
        create["properties"]["endpoint"]["enum"] = list(endpoints.PATHS)
        create["properties"]["completion_window"]["enum"] = windows.names()
    return result


def _batches(request):
    # The progress samples (up to ~3 KB a batch) are read for the Batch object's expected completion.
    return Batch.objects.for_org(request.user.organization).select_related(*PRESENTER_RELATED)


def _get_batch(request, batch_id):
    batch = _batches(request).filter(public_id=batch_id).first()
    if batch is None:
        raise NotFound(f"No batch found with id '{batch_id}'.", code="batch_not_found")
    return batch


def _body_print(request, body):
    """The same create: its JSON with keys sorted (so their order doesn't matter), or its bytes as sent
    when orjson can't write it back (nesting past 254 levels: a create refuses that record anyway)."""
    try:
        return idempotency.fingerprint(orjson.dumps(body, option=orjson.OPT_SORT_KEYS))
    except TypeError:
        return idempotency.fingerprint(request.body)


class BatchListView(APIView):
    def get_throttles(self):
        # Creating is rate limited per organization; listing is not.
        return [BatchCreateThrottle()] if self.request.method == "POST" else []

    def throttled(self, request, wait):
        raise BatchCreateThrottle.exceeded(wait)

    @extend_schema(
        operation_id="batches_create",
        summary="Create a batch",
        request={"application/json": openapi.ref("BatchCreate")},
        parameters=[openapi.IDEMPOTENCY_KEY],
        responses={200: openapi.ref("Batch"), **openapi.errors(400, 401, 402, 404, 409, 413, 415, 429, 503)},
    )
    def post(self, request):
        key = idempotency.key_of(request)
        body = json_body(request)
        params = parse_create_params(body)
        batch = idempotency.once(
            request.user.organization,
            "batches",
            key,
            _body_print(request, body) if key is not None else None,
            lambda: services.create_batch(
                organization=request.user.organization,
                params=params,
                admit=admission.judge(organization=request.user.organization, params=params),
            ),
            lambda public_id: _batches(request).filter(public_id=public_id).first(),
        )
        return Response(batch_object(batch))

    @extend_schema(
        operation_id="batches_list",
        summary="List batches",
        parameters=[openapi.LIST_LIMIT, openapi.AFTER],
        responses={200: openapi.ref("BatchList"), **openapi.errors(400, 401, 404)},
    )
    def get(self, request):
        return Response(newest_first_page(request, _batches(request), batch_object, "batch"))


class BatchEstimateView(APIView):
    throttle_classes = [BatchEstimateThrottle]  # one budget with the dashboard's quotes

    def throttled(self, request, wait):
        raise BatchEstimateThrottle.exceeded(wait)

    @extend_schema(
        operation_id="batches_estimate",
        summary="Quote a batch without creating it: records, tokens, cost, time, and the window",
        request={"application/json": openapi.ref("BatchCreate")},
        responses={200: openapi.ref("BatchEstimate"), **openapi.errors(400, 401, 404, 413, 415, 429)},
    )
    def post(self, request):
        params = parse_create_params(json_body(request))
        quote = quotes.estimate(organization=request.user.organization, **vars(params))
        return Response(quotes.quote_object(quote))


class BatchDetailView(APIView):
    @extend_schema(
        operation_id="batches_retrieve",
        summary="Retrieve a batch",
        parameters=[openapi.BATCH_ID],
        responses={200: openapi.ref("Batch"), **openapi.errors(401, 404)},
    )
    def get(self, request, batch_id):
        return Response(batch_object(_get_batch(request, batch_id)))


class BatchCancelView(APIView):
    @extend_schema(
        operation_id="batches_cancel",
        summary="Cancel a batch",
        request=None,
        parameters=[openapi.BATCH_ID],
        responses={200: openapi.ref("Batch"), **openapi.errors(401, 404, 409)},
    )
    def post(self, request, batch_id):
        batch = services.cancel_batch(_get_batch(request, batch_id))
        return Response(batch_object(batch))


class BatchPauseView(APIView):
    @extend_schema(
        operation_id="batches_pause",
        summary="Pause a running batch (OpenRelay's own)",
        request=None,
        parameters=[openapi.BATCH_ID],
        responses={200: openapi.ref("Batch"), **openapi.errors(401, 404, 409)},
    )
    def post(self, request, batch_id):
        batch = guardrails.pause_batch(_get_batch(request, batch_id))
        return Response(batch_object(batch))


class BatchResumeView(APIView):
    @extend_schema(
        operation_id="batches_resume",
        summary="Resume a paused batch, optionally with a new spend cap (OpenRelay's own)",
        request={"application/json": openapi.ref("BatchResume")},
        parameters=[openapi.BATCH_ID],
        responses={200: openapi.ref("Batch"), **openapi.errors(400, 401, 402, 404, 409, 415)},
    )
    def post(self, request, batch_id):
        body = request_object(json_body(request), ("max_cost",))
        max_cost_nanos = parse_max_cost(body.get("max_cost"), "max_cost")
        batch = guardrails.resume_batch(_get_batch(request, batch_id), max_cost_nanos=max_cost_nanos)
        return Response(batch_object(batch))


class BatchRetryView(APIView):
    @extend_schema(
        operation_id="batches_retry",
        summary="Retry a finished batch's failed records as a new batch",
        request=None,
        parameters=[openapi.BATCH_ID],
        responses={200: openapi.ref("Batch"), **openapi.errors(400, 401, 404, 409, 429)},
    )
    def post(self, request, batch_id):
        batch = services.retry_failed(_get_batch(request, batch_id))
        return Response(batch_object(batch))

    def get_throttles(self):
        return [BatchCreateThrottle()]  # it creates a batch

    def throttled(self, request, wait):
        raise BatchCreateThrottle.exceeded(wait)


RESULT_KINDS = ("output", "error")


class BatchResultsView(APIView):
    content_negotiation_class = IgnoreAcceptNegotiation

    @extend_schema(
        operation_id="batches_results",
        summary="Download the results finished so far",
        parameters=[openapi.BATCH_ID, openapi.RESULT_KIND, openapi.RESULT_CODE],
        responses={
            (200, "application/octet-stream"): OpenApiResponse(OpenApiTypes.BINARY),
            **openapi.errors(400, 401, 404),
        },
    )
    def get(self, request, batch_id):
        kind = request.query_params.get("kind", "output")  # `?kind=` is a value, not an absent parameter
        if kind not in RESULT_KINDS:
            raise ApiError(
                f"Invalid 'kind': {kind[:50]!r}; expected 'output' or 'error'.", param="kind", code="invalid_value"
            )
        batch = _get_batch(request, batch_id)
        stream, lines = results.render_one(batch, kind, code=(request.query_params.get("code") or "")[:64] or None)
        response = stream_response(
            request._request, stream, stream_size(stream), f"{batch.public_id}_{kind}_so_far.jsonl"
        )
        response["OpenRelay-Lines"] = str(lines)
        response["OpenRelay-Batch-Status"] = batch.status
        return response


class ModelListView(APIView):
    @extend_schema(
        operation_id="models_list",
        summary="List the models a batch may use",
        responses={200: openapi.ref("ModelList"), **openapi.errors(401)},
    )
    def get(self, request):
        concurrency = catalog.concurrency_now()
        data = [catalog.model_object(model, concurrency) for model in catalog.enabled_models()]
        return Response({"object": "list", "data": data})


class ModelDetailView(APIView):
    @extend_schema(
        operation_id="models_retrieve",
        summary="Retrieve a model",
        parameters=[openapi.MODEL_ID],
        responses={200: openapi.ref("Model"), **openapi.errors(401, 404)},
    )
    def get(self, request, model_id):
        model = catalog.enabled_models().filter(name=model_id).first()
        if model is None:
            raise NotFound(
                f"The model '{model_id}' does not exist or is not enabled.", param="model", code="model_not_found"
            )
        return Response(catalog.model_object(model, catalog.concurrency_now()))


class LimitsView(APIView):
    @extend_schema(
        operation_id="limits_retrieve",
        summary="The limits a batch must keep, for this organization",
        responses={200: openapi.ref("Limits"), **openapi.errors(401)},
    )
    def get(self, request):
        return Response(catalog.limits_object(request.user.organization))
