"""`/v1/messages/batches`: Anthropic's Message Batches routes, thin over services and presenters.

Authentication takes `x-api-key` or a Bearer token; `anthropic-version`, `anthropic-beta` and
the beta client's `?beta=true` are accepted and ignored. Only `/v1/messages` batches are seen
here; an id of anything else is a 404.
"""

import orjson
from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from batches.message_batches import params, presenters, results, services
from batches.models import Batch
from files.responses import stream_response, stream_size
from openrelay.api import openapi
from openrelay.api.errors import ApiError, NotFound
from openrelay.api.negotiation import IgnoreAcceptNegotiation
from openrelay.api.pagination import cursor_page, parse_limit
from openrelay.api.parsers import json_body
from openrelay.api.throttles import BatchCreateThrottle
from openrelay.core import idempotency
from openrelay.core.auth import AnthropicKeyAuthentication

LIST_LIMIT_MAX = 1000
MESSAGE_BATCH_ID = OpenApiParameter("message_batch_id", str, OpenApiParameter.PATH)
LIST_PARAMETERS = [
    OpenApiParameter(
        "limit",
        {"type": "integer", "minimum": 1, "maximum": LIST_LIMIT_MAX},
        OpenApiParameter.QUERY,
        description="Page size (default 20).",
    ),
    OpenApiParameter(
        "after_id", str, OpenApiParameter.QUERY, description="The page after (older than) this Message Batch."
    ),
    OpenApiParameter(
        "before_id", str, OpenApiParameter.QUERY, description="The page before (newer than) this Message Batch."
    ),
]


def _message_batches(request):
    return Batch.objects.for_org(request.user.organization).filter(endpoint=params.MESSAGES).defer("progress")


def _get(request, message_batch_id):
    public_id = presenters.batch_public_id(message_batch_id)
    batch = _message_batches(request).filter(public_id=public_id).first() if public_id else None
    if batch is None:
        raise NotFound(f"No Message Batch found with id '{message_batch_id[:100]}'.", code="batch_not_found")
    return batch


class AnthropicView(APIView):
    authentication_classes = [AnthropicKeyAuthentication]


class MessageBatchListView(AnthropicView):
    def get_throttles(self):
        return [BatchCreateThrottle()] if self.request.method == "POST" else []

    def throttled(self, request, wait):
        raise BatchCreateThrottle.exceeded(wait)

    @extend_schema(
        operation_id="message_batches_create",
        summary="Create a Message Batch (Anthropic's dialect)",
        request={"application/json": openapi.ref("MessageBatchCreate")},
        parameters=[openapi.IDEMPOTENCY_KEY],
        responses={200: openapi.ref("MessageBatch"), **openapi.anthropic_errors(400, 401, 409, 413, 429)},
    )
    def post(self, request):
        key = idempotency.key_of(request)
        body = _body(request)
        lines, (window, admission) = params.parse_requests(body), params.parse_extension(body)
        # Without the extension: the print as before.
        print_of = [lines, window, admission] if "openrelay" in body else lines
        batch = idempotency.once(
            request.user.organization,
            "message_batches",
            key,
            idempotency.fingerprint(orjson.dumps(print_of, option=orjson.OPT_SORT_KEYS)) if key is not None else None,
            lambda: services.create_message_batch(
                organization=request.user.organization, lines=lines, completion_window=window, admission=admission
            ),
            lambda public_id: _message_batches(request).filter(public_id=public_id).first(),
        )
        return Response(presenters.message_batch_object(batch))

    @extend_schema(
        operation_id="message_batches_list",
        summary="List Message Batches, newest first",
        parameters=LIST_PARAMETERS,
        responses={200: openapi.ref("MessageBatchList"), **openapi.anthropic_errors(400, 401, 404)},
    )
    def get(self, request):
        query = request.query_params
        limit = parse_limit(query.get("limit"), maximum=LIST_LIMIT_MAX)
        after, before = query.get("after_id"), query.get("before_id")
        if after and before:
            raise ApiError("Send after_id or before_id, not both.", param="before_id", code="invalid_value")
        rows, has_more = _page(request, limit, after, before)
        closed = presenters.closed_counts(rows)
        data = [presenters.message_batch_object(batch, closed.get(batch.pk, {})) for batch in rows]
        return Response(
            {
                "data": data,
                "has_more": has_more,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
            }
        )


def _page(request, limit, after, before):
    """Newest first: after_id pages to older batches, before_id to newer ones (read oldest first, then turned).
    A cursor that names no Message Batch of the caller's is a 404: an empty page would read as the list's end."""
    cursor, param = (after, "after_id") if after else (before, "before_id")
    public_id = presenters.batch_public_id(cursor) if cursor else None
    if cursor and public_id is None:
        raise _unknown_cursor(cursor, param)
    no_cursor = _unknown_cursor(cursor or "", param)
    if before:
        rows, has_more = cursor_page(
            _message_batches(request), limit=limit, after=public_id, order="asc", no_cursor=no_cursor
        )
        return rows[::-1], has_more
    return cursor_page(_message_batches(request), limit=limit, after=public_id, order="desc", no_cursor=no_cursor)


def _unknown_cursor(cursor, param):
    return NotFound(
        f"No Message Batch found with id '{cursor[:100]}' (the '{param}' cursor).", param=param, code="not_found"
    )


def _body(request):
    limit = settings.OPENRELAY_MAX_MESSAGE_BATCH_BYTES
    try:
        return json_body(request, max_bytes=limit)
    except ApiError as exc:
        if exc.status != 413:
            raise
        raise ApiError(
            f"The request body is larger than {limit:,} bytes, this server's limit for a Message Batch "
            "(OPENRELAY_MAX_MESSAGE_BATCH_BYTES). Split the requests into several batches.",
            status=413,
            code="request_too_large",
        ) from None


class MessageBatchDetailView(AnthropicView):
    @extend_schema(
        operation_id="message_batches_retrieve",
        summary="Retrieve a Message Batch",
        parameters=[MESSAGE_BATCH_ID],
        responses={200: openapi.ref("MessageBatch"), **openapi.anthropic_errors(401, 404)},
    )
    def get(self, request, message_batch_id):
        return Response(presenters.message_batch_object(_get(request, message_batch_id)))

    @extend_schema(
        operation_id="message_batches_delete",
        summary="Delete an ended Message Batch and its results",
        parameters=[MESSAGE_BATCH_ID],
        responses={200: openapi.ref("DeletedMessageBatch"), **openapi.anthropic_errors(400, 401, 404)},
    )
    def delete(self, request, message_batch_id):
        batch = _get(request, message_batch_id)
        services.delete_message_batch(batch)
        return Response({"id": presenters.message_batch_id(batch), "type": "message_batch_deleted"})


class MessageBatchCancelView(AnthropicView):
    @extend_schema(
        operation_id="message_batches_cancel",
        summary="Cancel a Message Batch",
        request=None,
        parameters=[MESSAGE_BATCH_ID],
        responses={200: openapi.ref("MessageBatch"), **openapi.anthropic_errors(401, 404)},
    )
    def post(self, request, message_batch_id):
        batch = services.cancel_message_batch(_get(request, message_batch_id))
        return Response(presenters.message_batch_object(batch))


class MessageBatchResultsView(AnthropicView):
    content_negotiation_class = IgnoreAcceptNegotiation

    @extend_schema(
        operation_id="message_batches_results",
        summary="Stream an ended Message Batch's results (JSONL)",
        parameters=[MESSAGE_BATCH_ID],
        responses={
            (200, "application/binary"): OpenApiResponse(OpenApiTypes.BINARY),
            **openapi.anthropic_errors(400, 401, 404),
        },
    )
    def get(self, request, message_batch_id):
        batch = _get(request, message_batch_id)
        if not batch.is_terminal:
            raise ApiError(
                f"Message Batch {presenters.message_batch_id(batch)} has not ended yet; its results are ready once "
                "processing_status is 'ended'.",
                code="batch_not_ended",
            )
        stream, _ = results.render(batch)
        response = stream_response(
            request._request, stream, stream_size(stream), f"{presenters.message_batch_id(batch)}_results.jsonl"
        )
        response["Content-Type"] = "application/binary"
        return response
