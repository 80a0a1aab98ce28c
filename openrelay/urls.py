from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularJSONAPIView

urlpatterns = [
    path("v1/", include("files.urls")),
    path("v1/", include("batches.urls")),
    path("v1/", include("billing.urls")),
    path("v1/", include("openrelay.webhooks.urls")),
    # JSON, as the name says (the plain SpectacularAPIView answers YAML by default).
    path("v1/openapi.json", SpectacularJSONAPIView.as_view(authentication_classes=[], permission_classes=[]),
         name="openapi-schema"),
    path("admin/", admin.site.urls),
    path("", include("batches.dashboard_urls")),
]
