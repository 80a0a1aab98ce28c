from django.urls import path

from webhooks import views

# No trailing slashes, as the OpenAI SDK requests them.
urlpatterns = [
    path("webhook_endpoints", views.WebhookEndpointListView.as_view(), name="webhook-endpoint-list"),
    path(
        "webhook_endpoints/<str:webhook_endpoint_id>",
        views.WebhookEndpointDetailView.as_view(),
        name="webhook-endpoint-detail",
    ),
    path(
        "webhook_endpoints/<str:webhook_endpoint_id>/rotate_secret",
        views.WebhookEndpointRotateView.as_view(),
        name="webhook-endpoint-rotate",
    ),
    path(
        "webhook_endpoints/<str:webhook_endpoint_id>/test",
        views.WebhookEndpointTestView.as_view(),
        name="webhook-endpoint-test",
    ),
    path("webhook_event_types", views.WebhookEventTypesView.as_view(), name="webhook-event-types"),
]
