"""Admin: the read-only ledger, and each organization's billing (prices are the catalog's: openrelay.core.admin).

The organization page is openrelay's OrganizationAdmin (its workflow toggle
included), re-registered here as a subclass that adds the billing section
and its CSV export, so the core admin needs no import from billing.
"""

import csv
from itertools import groupby

from django.contrib import admin
from django.contrib.admin.utils import unquote
from django.http import Http404, StreamingHttpResponse
from django.urls import path, reverse
from django.utils.http import urlencode
from django.utils.text import slugify

from billing import ledger
from billing.models import LedgerEntry
from billing.pricing import usd
from openrelay.core.admin import OrganizationAdmin
from openrelay.core.models import Organization

CSV_COLUMNS = (
    "billed_at",
    "month",
    "batch_id",
    "batch_status",
    "model",
    "priority",
    "input_tokens",
    "cached_tokens",
    "output_tokens",
    "reasoning_tokens",
    "price_input_per_mtok",
    "price_cached_input_per_mtok",
    "price_output_per_mtok",
    "price_multiplier",
    "cost_input_usd",
    "cost_cached_input_usd",
    "cost_output_usd",
    "cost_total_usd",
)


@admin.register(LedgerEntry)
class LedgerEntryAdmin(admin.ModelAdmin):
    """The books: entries are written by the engine only, and never edited or deleted."""

    list_display = (
        "batch_id",
        "organization",
        "model_name",
        "priority",
        "batch_status",
        "input_tokens",
        "cached_tokens",
        "output_tokens",
        "total_cost",
        "created_at",
    )
    list_filter = ("organization", "model_name", "priority", "batch_status")
    list_select_related = ("organization",)
    date_hierarchy = "created_at"
    search_fields = ("batch_id",)
    fields = (
        "batch_id",
        "organization",
        "batch_status",
        "model_name",
        "priority",
        "created_at",
        "input_tokens",
        "cached_tokens",
        "output_tokens",
        "reasoning_tokens",
        "price_input",
        "price_cached_input",
        "price_output",
        "price_multiplier",
        "input_cost",
        "cached_input_cost",
        "output_cost",
        "total_cost",
    )
    readonly_fields = fields

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.display(description="input cost (USD)")
    def input_cost(self, entry):
        return usd(entry.input_cost_nanos)

    @admin.display(description="cached input cost (USD)")
    def cached_input_cost(self, entry):
        return usd(entry.cached_input_cost_nanos)

    @admin.display(description="output cost (USD)")
    def output_cost(self, entry):
        return usd(entry.output_cost_nanos)

    @admin.display(description="total cost (USD)", ordering="total_cost_nanos")
    def total_cost(self, entry):
        return usd(entry.total_cost_nanos)


class BillingOrganizationAdmin(OrganizationAdmin):
    change_form_template = "billing/admin/organization_change_form.html"

    def get_urls(self):
        info = self.opts.app_label, self.opts.model_name
        csv_url = path(
            "<path:object_id>/billing.csv",
            self.admin_site.admin_view(self.billing_csv),
            name="{}_{}_billing_csv".format(*info),
        )
        # Ahead of the inherited patterns: their "<path:object_id>/" catch-all would take it.
        return [csv_url, *super().get_urls()]

    def change_view(self, request, object_id, form_url="", extra_context=None):
        organization = self.get_object(request, unquote(object_id))
        if organization is not None:
            extra_context = {**(extra_context or {}), "billing": self._billing(organization)}
        return super().change_view(request, object_id, form_url, extra_context)

    def billing_csv(self, request, object_id):
        organization = self.get_object(request, unquote(object_id))
        if organization is None or not self.has_view_or_change_permission(request, organization):
            raise Http404("No such organization.")
        entries = LedgerEntry.objects.filter(organization=organization).order_by("created_at", "pk")
        response = StreamingHttpResponse(_csv_lines(entries.iterator()), content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="billing-{slugify(organization.name)}.csv"'
        return response

    def _billing(self, organization):
        by_month = ledger.totals_by_month_and_model(organization)
        by_model = ledger.totals_by_model(organization)
        return {
            "months": [_month(month, list(rows), organization) for month, rows in groupby(by_month, _month_key)],
            "models": [_shown(row) for row in by_model],
            "total": _shown(ledger.grand_total(by_model)),
            "csv_url": reverse(
                f"admin:{self.opts.app_label}_{self.opts.model_name}_billing_csv", args=[organization.pk]
            ),
        }


def _month_key(row):
    return row["month"].strftime("%Y-%m")


def _month(month, rows, organization):
    """A month's total and its per-model rows, each linking to the ledger entries (the batches) behind it."""
    year, number = month.split("-")
    where = {
        "organization__id__exact": organization.pk,
        "created_at__year": int(year),
        "created_at__month": int(number),
    }
    changelist = reverse("admin:billing_ledgerentry_changelist")
    return {
        "month": month,
        "total": _shown(ledger.grand_total(rows)),
        "entries_url": f"{changelist}?{urlencode(where)}",
        "models": [
            {**_shown(row), "entries_url": f"{changelist}?{urlencode({**where, 'model_name': row['model_name']})}"}
            for row in rows
        ],
    }


def _shown(row):
    """A totals row as the page shows it: amounts as USD strings."""
    return {**row, "cost": row["cost"].as_object()}


class _Echo:
    def write(self, value):
        return value


def _csv_lines(entries):
    writer = csv.writer(_Echo())
    yield writer.writerow(CSV_COLUMNS)
    for entry in entries:
        yield writer.writerow([_cell(value) for value in _csv_row(entry)])


def _csv_row(entry):
    cost = entry.cost
    return (
        entry.created_at.isoformat(),
        entry.created_at.strftime("%Y-%m"),
        entry.batch_id,
        entry.batch_status,
        entry.model_name,
        entry.priority,
        entry.input_tokens,
        entry.cached_tokens,
        entry.output_tokens,
        entry.reasoning_tokens,
        entry.price_input,
        entry.price_cached_input,
        entry.price_output,
        entry.price_multiplier,
        usd(cost.input_nanos),
        usd(cost.cached_input_nanos),
        usd(cost.output_nanos),
        usd(cost.total_nanos),
    )


def _cell(value):
    # A spreadsheet runs a cell starting with one of these as a formula;
    # model names are free text typed into the admin.
    text = str(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@") else text


# openrelay registers OrganizationAdmin first (it comes before billing in
# INSTALLED_APPS); this replaces it with the subclass above.
if admin.site.is_registered(Organization):
    admin.site.unregister(Organization)
admin.site.register(Organization, BillingOrganizationAdmin)
