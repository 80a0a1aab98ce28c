from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

urlpatterns = [
    path("v1/", include("files.urls")),
    path("v1/", include("batches.urls")),
    path("v1/openapi.json", SpectacularAPIView.as_view(authentication_classes=[], permission_classes=[]), name="openapi-schema"),
    path("admin/", admin.site.urls),
    path("", include("batches.dashboard_urls")),
]
