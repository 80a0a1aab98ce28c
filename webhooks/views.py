"""Webhook endpoints API (OpenAI's /v1/webhook_endpoints): thin views over services and presenters."""

from django.db import transaction
from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from openrelay.api import openapi
from openrelay.api.errors import NotFound
from openrelay.api.pagination import newest_first_page
from openrelay.api.parsers import json_body
from webhooks import params, services
from webhooks.models import EVENT_TYPES, WebhookEndpoint
from webhooks.presenters import endpoint_object


def _endpoints(request):
    return WebhookEndpoint.objects.for_org(request.user.organization)


def _get_endpoint(request, endpoint_id, *, for_update=False):
    endpoints = _endpoints(request)
    if for_update:
        endpoints = endpoints.select_for_update()
    endpoint = endpoints.filter(public_id=endpoint_id).first()
    if endpoint is None:
        raise NotFound(f"No webhook endpoint found with id '{endpoint_id}'.", code="webhook_endpoint_not_found")
    return endpoint


class WebhookEndpointListView(APIView):
    @extend_schema(
        operation_id="webhook_endpoints_create",
        summary="Create a webhook endpoint",
        request={"application/json": openapi.ref("WebhookEndpointCreate")},
        responses={200: openapi.ref("WebhookEndpointWithSecret"), **openapi.errors(400, 401, 413, 415)},
    )
    def post(self, request):
        fields = params.parse_endpoint(json_body(request))
        endpoint, secret = services.create_endpoint(request.user.organization, **fields)
        return Response(endpoint_object(endpoint, secret))

    @extend_schema(
        operation_id="webhook_endpoints_list",
        summary="List webhook endpoints",
        parameters=[openapi.LIST_LIMIT, openapi.AFTER],
        responses={200: openapi.ref("WebhookEndpointList"), **openapi.errors(400, 401, 404)},
    )
    def get(self, request):
        return Response(newest_first_page(request, _endpoints(request), endpoint_object, "webhook endpoint"))


class WebhookEndpointDetailView(APIView):
    @extend_schema(
        operation_id="webhook_endpoints_retrieve",
        summary="Retrieve a webhook endpoint",
        parameters=[openapi.WEBHOOK_ENDPOINT_ID],
        responses={200: openapi.ref("WebhookEndpoint"), **openapi.errors(401, 404)},
    )
    def get(self, request, webhook_endpoint_id):
        return Response(endpoint_object(_get_endpoint(request, webhook_endpoint_id)))

    @extend_schema(
        operation_id="webhook_endpoints_update",
        summary="Update a webhook endpoint",
        parameters=[openapi.WEBHOOK_ENDPOINT_ID],
        request={"application/json": openapi.ref("WebhookEndpointUpdate")},
        responses={200: openapi.ref("WebhookEndpoint"), **openapi.errors(400, 401, 404, 413, 415)},
    )
    def post(self, request, webhook_endpoint_id):
        fields = params.parse_endpoint(json_body(request), partial=True)
        with transaction.atomic():
            endpoint = services.update_endpoint(_get_endpoint(request, webhook_endpoint_id, for_update=True), **fields)
        return Response(endpoint_object(endpoint))

    @extend_schema(
        operation_id="webhook_endpoints_delete",
        summary="Delete a webhook endpoint",
        parameters=[openapi.WEBHOOK_ENDPOINT_ID],
        responses={200: openapi.ref("WebhookEndpointDeleted"), **openapi.errors(401, 404)},
    )
    def delete(self, request, webhook_endpoint_id):
        endpoint = _get_endpoint(request, webhook_endpoint_id)
        endpoint.delete()  # its pending deliveries go with it
        return Response({"id": webhook_endpoint_id, "object": "webhook_endpoint.deleted", "deleted": True})


class WebhookEndpointRotateView(APIView):
    @extend_schema(
        operation_id="webhook_endpoints_rotate_secret",
        summary="Rotate a webhook endpoint's secret",
        parameters=[openapi.WEBHOOK_ENDPOINT_ID],
        request={"application/json": openapi.ref("WebhookEndpointRotate")},
        responses={200: openapi.ref("WebhookEndpointWithSecret"), **openapi.errors(400, 401, 404, 415)},
    )
    def post(self, request, webhook_endpoint_id):
        keep_old = params.parse_rotate(json_body(request))
        with transaction.atomic():
            endpoint = _get_endpoint(request, webhook_endpoint_id, for_update=True)
            secret = services.rotate_secret(endpoint, keep_old=keep_old)
        return Response(endpoint_object(endpoint, secret))


class WebhookEndpointTestView(APIView):
    @extend_schema(
        operation_id="webhook_endpoints_test",
        summary="Send a sample event to a webhook endpoint",
        parameters=[openapi.WEBHOOK_ENDPOINT_ID],
        request={"application/json": openapi.ref("WebhookEndpointTest")},
        responses={200: openapi.ref("WebhookEndpointTestResult"), **openapi.errors(400, 401, 404, 415)},
    )
    def post(self, request, webhook_endpoint_id):
        event_type = params.parse_test(json_body(request))
        endpoint = _get_endpoint(request, webhook_endpoint_id)
        status_code = services.send_test(endpoint, event_type)
        return Response(
            {
                "object": "webhook_endpoint.test",
                "webhook_endpoint_id": endpoint.public_id,
                "event_type": event_type,
                "status_code": status_code,
                "success": True,
            }
        )


class WebhookEventTypesView(APIView):
    @extend_schema(
        operation_id="webhook_event_types_list",
        summary="List the webhook event types",
        responses={200: openapi.ref("WebhookEventTypeList"), **openapi.errors(401)},
    )
    def get(self, request):
        return Response({"object": "list", "data": list(EVENT_TYPES)})
