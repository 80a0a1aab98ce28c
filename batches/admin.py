from django.contrib import admin, messages

from batches import services
from batches.models import Batch
from openrelay.errors import ApiError


@admin.register(Batch)
class BatchAdmin(admin.ModelAdmin):
    """Read-only: rejected records and bodies stay out (input lines may carry authorization values)."""

    # The three counts in one column: ten columns beside the filters fit 1,280 px.
    list_display = ("public_id", "organization", "model_name", "status", "priority", "records",
                    "implausible_usage", "created_at")
    list_filter = ("status", "priority", "organization", "model_name")
    search_fields = ("public_id", "organization__name", "input_file_public_id")
    date_hierarchy = "created_at"
    exclude = ("errors",)
    actions = ["cancel"]

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields if f.name != "errors"]

    @admin.display(description="records (done / total)", ordering="total_count")
    def records(self, batch):
        done = batch.completed_count + batch.failed_count
        failed = f", {batch.failed_count:,} failed" if batch.failed_count else ""
        return f"{done:,} / {batch.total_count:,}{failed}"

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
