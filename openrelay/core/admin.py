from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin

from openrelay.core.models import ApiKey, Deployment, Membership, Model, Organization, Price

# The app list beside every page took 290 of 1,280 px from the change lists (the ledger's ten
# columns ran past the edge); the index page and the breadcrumbs lead everywhere it did.
admin.site.enable_nav_sidebar = False


class ApiKeyInline(admin.TabularInline):
    model = ApiKey
    extra = 0
    fields = ("name", "lookup", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("lookup", "created_at", "last_used_at")
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None):
        return False  # keys are issued from the API key page, which shows them once


@admin.register(Organization)
class OrganizationAdmin(admin.ModelAdmin):
    list_display = ("name", "workflows_enabled", "max_concurrency", "reuse_cache_ttl_s", "created_at")
    list_filter = ("workflows_enabled",)
    search_fields = ("name",)
    inlines = [ApiKeyInline]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("lookup", "organization", "name", "created_at", "last_used_at", "revoked_at")
    list_filter = ("organization",)
    search_fields = ("lookup", "name", "organization__name")
    fields = ("organization", "name", "lookup", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("lookup", "created_at", "last_used_at")
    actions = ["revoke"]

    def save_model(self, request, obj, form, change):
        if change:
            return super().save_model(request, obj, form, change)
        row, plaintext = ApiKey.issue(obj.organization, obj.name)
        obj.pk, obj.lookup, obj.hashed = row.pk, row.lookup, row.hashed
        obj._state.adding = False
        messages.warning(request, f"New API key (shown once, copy it now): {plaintext}")

    @admin.action(description="Revoke selected keys")
    def revoke(self, request, queryset):
        for key in queryset.active():
            key.revoke()


class DeploymentForm(forms.ModelForm):
    base_url = forms.URLField(max_length=500, assume_scheme="https", help_text="e.g. http://127.0.0.1:8001/v1")
    # The upstream key is write-only: never rendered back into the page.
    api_key = forms.CharField(
        required=False, widget=forms.PasswordInput(render_value=False), help_text="Leave empty to keep the current key."
    )

    class Meta:
        model = Deployment
        fields = ("model", "base_url", "upstream_model", "api_key", "max_concurrency", "messages_api", "enabled")

    def clean_api_key(self):
        value = self.cleaned_data.get("api_key")
        if not value and self.instance.pk:
            return self.instance.api_key
        return value or ""


class DeploymentInline(admin.TabularInline):
    model = Deployment
    form = DeploymentForm
    extra = 0
    readonly_fields = ("health", "health_changed_at", "last_error")


@admin.register(Model)
class ModelAdmin(admin.ModelAdmin):
    list_display = ("name", "enabled", "created_at")
    inlines = [DeploymentInline]


@admin.register(Deployment)
class DeploymentAdmin(admin.ModelAdmin):
    form = DeploymentForm
    list_display = (
        "model",
        "base_url",
        "upstream_model",
        "max_concurrency",
        "messages_api",
        "enabled",
        "health",
        "health_changed_at",
        "last_error",
    )
    list_filter = ("model", "enabled", "health")
    # Written by the engines as they take a failing deployment out of the rotation and
    # probe it back in (batches.engine.calls.health); the error has the deployment's key removed.
    readonly_fields = ("health", "health_changed_at", "last_error")


class MembershipInline(admin.StackedInline):
    model = Membership
    extra = 0
    max_num = 1
    fields = ("organization",)
    verbose_name = "organization (dashboard access)"


# The stock user admin plus the user's organization: who sees which
# organization's batches in the dashboard is set here or with `add_user`.
User = get_user_model()
admin.site.unregister(User)


@admin.register(User)
class MemberUserAdmin(UserAdmin):
    inlines = [MembershipInline]
    list_display = (*UserAdmin.list_display, "organization")
    list_select_related = ("membership__organization",)

    @admin.display(description="organization", ordering="membership__organization__name")
    def organization(self, user):
        membership = getattr(user, "membership", None)
        return membership.organization if membership else "-"


@admin.register(Price)
class PriceAdmin(admin.ModelAdmin):
    list_display = ("model", "input_per_mtok", "cached_input", "output_per_mtok", "updated_at")
    list_select_related = ("model",)
    search_fields = ("model__name",)
    fieldsets = [
        (
            "USD per 1M tokens at the sync rate",
            {
                "fields": ("model", "input_per_mtok", "cached_input_per_mtok", "output_per_mtok"),
                "description": "Standard batches bill 50% of these, expedited batches 100%. Cached input tokens are "
                "billed at the input price unless a cached input price is set. A batch keeps the "
                "prices it was created with: a change here applies to batches created after it.",
            },
        )
    ]

    @admin.display(description="cached input per mtok", ordering="cached_input_per_mtok")
    def cached_input(self, price):
        """The effective price, and where it comes from when no discount is set."""
        if price.cached_input_per_mtok is None:
            return f"{price.input_per_mtok} (the input price)"
        return price.cached_input_per_mtok
