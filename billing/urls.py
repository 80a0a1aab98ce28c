from django.urls import path

from billing import views

# A control-plane route (openrelay/web/hosts.py): served by the control host.
urlpatterns = [
    path("organization/usage", views.UsageView.as_view(), name="organization-usage"),
]
