from django.contrib import admin

from webhooks import signing
from webhooks.models import WebhookDelivery, WebhookEndpoint


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):
    # The signing secret is never shown: only its hint (the API shows it once, at create or rotate).
    list_display = ("public_id", "name", "organization", "url", "created_at")
    list_filter = ("organization",)
    search_fields = ("public_id", "name", "url", "organization__name")
    fields = ("public_id", "organization", "name", "url", "event_types", "secret_hint", "created_at", "updated_at")
    readonly_fields = ("public_id", "organization", "secret_hint", "created_at", "updated_at")

    @admin.display(description="signing secret")
    def secret_hint(self, endpoint):
        return signing.hint(endpoint.signing_secret)

    def has_add_permission(self, request):
        return False  # created through the API, which hands the secret to its owner once


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin):
    list_display = ("event_id", "event_type", "endpoint", "status", "attempts", "last_status_code", "next_attempt_at")
    list_filter = ("status", "event_type")
    search_fields = ("event_id", "endpoint__public_id")
    readonly_fields = [f.name for f in WebhookDelivery._meta.fields]

    def has_add_permission(self, request):
        return False
