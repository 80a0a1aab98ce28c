from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularJSONAPIView

from batches.metrics import metrics_view

urlpatterns = [
    path("v1/", include("files.urls")),
    path("v1/", include("batches.urls")),
    # Anthropic's Message Batches: the same batches in a second dialect.
    path("v1/", include("batches.message_batches.urls")),
    path("v1/", include("billing.urls")),
    path("v1/", include("webhooks.urls")),
    # JSON, as the name says (the plain SpectacularAPIView answers YAML by default).
    path(
        "v1/openapi.json",
        SpectacularJSONAPIView.as_view(authentication_classes=[], permission_classes=[]),
        name="openapi-schema",
    ),
    # Prometheus' scrape (off until OPENRELAY_METRICS_TOKEN is set; docs/guides/monitoring.md).
    path("metrics", metrics_view, name="metrics"),
    path("admin/", admin.site.urls),
    path("", include("batches.dashboard.urls")),
]
