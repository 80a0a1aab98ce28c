from django.contrib import admin, messages

from batches import guardrails, operator, services
from batches.models import Batch
from billing.admin import BillingOrganizationAdmin
from billing.pricing import usd
from openrelay.api.errors import ApiError
from openrelay.core.admin import DeploymentAdmin, ModelAdmin
from openrelay.core.models import Deployment, Model, Organization


@admin.register(Batch)
class BatchAdmin(admin.ModelAdmin):
    """Read-only: rejected records and bodies stay out (input lines may carry authorization values)."""

    # The three counts in one column: ten columns beside the filters fit 1,280 px.
    list_display = (
        "public_id",
        "organization",
        "model_name",
        "status",
        "priority",
        "records",
        "implausible_usage",
        "paused",
        "created_at",
    )
    list_filter = ("status", "priority", "organization", "model_name")
    search_fields = ("public_id", "organization__name", "input_file_public_id")
    date_hierarchy = "created_at"
    exclude = ("errors",)
    actions = ["cancel", "pause", "resume"]

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields if f.name != "errors"]

    @admin.display(description="records (done / total)", ordering="total_count")
    def records(self, batch):
        done = batch.completed_count + batch.failed_count
        failed = f", {batch.failed_count:,} failed" if batch.failed_count else ""
        return f"{done:,} / {batch.total_count:,}{failed}"

    @admin.display(description="paused", ordering="paused_at")
    def paused(self, batch):
        return f"{batch.pause_reason} since {batch.paused_at:%Y-%m-%d %H:%M} UTC" if batch.is_paused else "-"

    @admin.action(description="Pause selected batches")
    def pause(self, request, queryset):
        self._each(request, queryset, guardrails.pause_batch, "Paused")

    @admin.action(description="Resume selected batches")
    def resume(self, request, queryset):
        self._each(request, queryset, guardrails.resume_batch, "Resumed")

    def _each(self, request, queryset, action, done):
        count = 0
        for batch in queryset.select_related("organization"):
            try:
                action(batch)
                count += 1
            except ApiError as exc:
                messages.error(request, f"{batch.public_id}: {exc.message}")
        if count:
            messages.success(request, f"{done} {count} batch(es).")

    @admin.display(description="implausible usage", ordering="implausible_usage_count")
    def implausible_usage(self, batch):
        """Records whose server-reported usage cannot be right (billed as reported)."""
        return batch.implausible_usage_count

    def has_add_permission(self, request):
        return False  # batches are created through the API or the dashboard

    def has_change_permission(self, request, obj=None):
        return False

    @admin.action(description="Cancel selected batches")
    def cancel(self, request, queryset):
        for batch in queryset:
            try:
                services.cancel_batch(batch)
            except ApiError as exc:
                messages.warning(request, f"{batch.public_id}: {exc.message}")


# --- the catalog's pages with the engines' figures (registered by openrelay, extended here:
# the core knows nothing of the engines, batches.operator reads their figures) ---------------


def _figures(request):
    """The operator page's overview, read once per page (five queries, whatever the rows)."""
    if not hasattr(request, "_operator_overview"):
        request._operator_overview = operator.overview()
    return request._operator_overview


def _against_limit(in_flight, limit, ceiling):
    """ "12 / 16 (max 64)": calls in flight against the adaptive limit, and the ceiling when it is lower."""
    return f"{in_flight} / {limit}" + (f" (max {ceiling})" if limit != ceiling else "")


def _percent(value):
    return "-" if value is None else f"{value:.1f}%"


class DeploymentWithLoadAdmin(DeploymentAdmin):
    """Each deployment's health with its calls in flight against its limit, calls a minute and
    error rate: the live engines' figures (published every 0.5 s); a page load reads them."""

    list_display = (
        "model",
        "base_url",
        "upstream_model",
        "enabled",
        "state",
        "health",
        "health_changed_at",
        "last_error",
        "calls_in_flight",
        "calls_a_minute",
        "error_rate",
    )
    readonly_fields = (*DeploymentAdmin.readonly_fields, "state", "calls_in_flight", "calls_a_minute", "error_rate")

    def get_changelist_instance(self, request):
        changelist = super().get_changelist_instance(request)
        for deployment in changelist.result_list:
            deployment.load = self._calls(request, deployment)
        return changelist

    def get_object(self, request, object_id, from_field=None):
        deployment = super().get_object(request, object_id, from_field)
        if deployment is not None:
            deployment.load = self._calls(request, deployment)
        return deployment

    @staticmethod
    def _calls(request, deployment):
        for model in _figures(request).models:
            for row, calls in model.deployments:
                if row.pk == deployment.pk:
                    return calls
        return operator.Calls()

    @admin.display(description="state")
    def state(self, deployment):
        """up, failing (in the rotation, calls failed in the last minute), down (out, probed) or disabled."""
        return operator.state(deployment, getattr(deployment, "load", None) or operator.Calls())

    @admin.display(description="calls in flight / limit")
    def calls_in_flight(self, deployment):
        calls = getattr(deployment, "load", None) or operator.Calls()
        return _against_limit(calls.in_flight, calls.limit_of(deployment), deployment.max_concurrency)

    @admin.display(description="calls a minute")
    def calls_a_minute(self, deployment):
        return (getattr(deployment, "load", None) or operator.Calls()).a_minute

    @admin.display(description="error rate (last minute)")
    def error_rate(self, deployment):
        return _percent((getattr(deployment, "load", None) or operator.Calls()).error_rate)


class ModelWithQueueAdmin(ModelAdmin):
    """Each model with its queue depth (records of running batches neither finished nor claimed),
    its records in flight and its calls in flight against its deployments' limits."""

    list_display = ("name", "enabled", "queue_depth", "records_in_flight", "calls_in_flight", "created_at")
    readonly_fields = ("queue_depth", "records_in_flight", "calls_in_flight")

    def _view(self, request, model):
        for view in _figures(request).models:
            if view.name == model.name:
                return view
        return operator.ModelView(model.name, model.enabled)

    def get_changelist_instance(self, request):
        changelist = super().get_changelist_instance(request)
        for model in changelist.result_list:
            model.load = self._view(request, model)
        return changelist

    def get_object(self, request, object_id, from_field=None):
        model = super().get_object(request, object_id, from_field)
        if model is not None:
            model.load = self._view(request, model)
        return model

    @admin.display(description="queue depth")
    def queue_depth(self, model):
        return model.load.work.queued if hasattr(model, "load") else "-"

    @admin.display(description="records in flight")
    def records_in_flight(self, model):
        return model.load.work.in_flight if hasattr(model, "load") else "-"

    @admin.display(description="calls in flight / limit")
    def calls_in_flight(self, model):
        if not hasattr(model, "load"):
            return "-"
        return _against_limit(model.load.calls.in_flight, model.load.limit, model.load.ceiling)


class OrganizationWithSpendAdmin(BillingOrganizationAdmin):
    """Billing's organization pages with this month's spend against the budget (set `monthly_budget`
    here). billing.admin is imported above, so its registration comes first and this one stands."""

    list_display = (*BillingOrganizationAdmin.list_display[:-1], "monthly_budget", "spent_this_month", "created_at")
    readonly_fields = ("spent_this_month",)

    @admin.display(description="spent this month (USD)")
    def spent_this_month(self, organization):
        if organization.pk is None:
            return "-"
        spent = guardrails.organization_spend_nanos(organization.pk)
        budget = guardrails.budget_nanos(organization)
        if budget is None:
            return usd(spent)
        share = f"{100 * spent / budget:.0f}%" if budget else "-"
        return f"{usd(spent)} of {usd(budget)} ({share}){' - exhausted' if spent >= budget else ''}"


admin.site.unregister(Organization)
admin.site.register(Organization, OrganizationWithSpendAdmin)
admin.site.unregister(Deployment)
admin.site.register(Deployment, DeploymentWithLoadAdmin)
admin.site.unregister(Model)
admin.site.register(Model, ModelWithQueueAdmin)
