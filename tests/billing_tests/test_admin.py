"""Admin: prices, the read-only ledger, and the organization's billing section with its CSV export."""

import csv
import io
from datetime import date
from decimal import Decimal

import pytest
from django.urls import reverse

from openrelay.core.models import Model, Price
from tests.billing_tests.conftest import OTHER_MODEL, entry
from tests.helpers import MODEL

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(client, admin_user):
    client.force_login(admin_user)
    return client


def org_page(alice):
    return reverse("admin:openrelay_organization_change", args=[alice.org.pk])


def csv_rows(response):
    return list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))


def test_it_sets_prices_in_the_admin(staff):
    model = Model.objects.create(name=MODEL)
    response = staff.post(
        reverse("admin:openrelay_price_add"),
        {"model": model.pk, "input_per_mtok": "0.15", "cached_input_per_mtok": "0.075", "output_per_mtok": "0.6"},
    )
    assert response.status_code == 302
    price = Price.objects.get(model=model)
    assert (price.input_per_mtok, price.cached_input_per_mtok, price.output_per_mtok) == (
        Decimal("0.15"),
        Decimal("0.075"),
        Decimal("0.6"),
    )
    page = staff.get(reverse("admin:openrelay_price_changelist")).content.decode()
    assert MODEL in page and "0.150000" in page


def test_it_refuses_a_negative_price(staff):
    model = Model.objects.create(name=MODEL)
    response = staff.post(
        reverse("admin:openrelay_price_add"),
        {"model": model.pk, "input_per_mtok": "-1", "cached_input_per_mtok": "0", "output_per_mtok": "0"},
    )
    assert response.status_code == 200 and not Price.objects.exists()


def test_the_ledger_is_read_only(staff, alice):
    row = entry(alice.org, date(2026, 12, 1))
    assert staff.get(reverse("admin:billing_ledgerentry_changelist")).status_code == 200
    page = staff.get(reverse("admin:billing_ledgerentry_change", args=[row.pk]))
    assert page.status_code == 200 and b"0.000200800" in page.content and b'name="_save"' not in page.content
    assert staff.get(reverse("admin:billing_ledgerentry_add")).status_code == 403
    assert staff.post(reverse("admin:billing_ledgerentry_delete", args=[row.pk]), {"post": "yes"}).status_code == 403
    assert (
        staff.post(reverse("admin:billing_ledgerentry_change", args=[row.pk]), {"total_cost_nanos": 0}).status_code
        == 403
    )
    row.refresh_from_db()
    assert row.total_cost_nanos == 200_800


def test_the_organization_page_shows_its_workflow_toggle_and_its_billing(staff, alice, bob):
    entry(alice.org, date(2026, 11, 30))
    entry(alice.org, date(2026, 12, 1))
    entry(alice.org, date(2026, 12, 2), model=OTHER_MODEL, tokens=(10, 0, 10))
    entry(bob.org, date(2026, 12, 1), tokens=(5, 0, 5))

    response = staff.get(org_page(alice))

    assert response.status_code == 200
    page = response.content.decode()
    assert 'name="workflows_enabled"' in page
    billing = response.context["billing"]
    months = [(m["month"], m["total"]["batches"], m["total"]["cost"]["total"]) for m in billing["months"]]
    assert months == [("2026-12", 2, "0.000205800"), ("2026-11", 1, "0.000200800")]
    assert [(r["model_name"], r["batches"]) for r in billing["months"][0]["models"]] == [(MODEL, 1), (OTHER_MODEL, 1)]
    assert [(r["model_name"], r["batches"], r["cost"]["total"]) for r in billing["models"]] == [
        (MODEL, 2, "0.000401600"),
        (OTHER_MODEL, 1, "0.000005000"),
    ]
    assert billing["total"]["cost"]["total"] == "0.000406600" and billing["total"]["batches"] == 3
    for shown in ("2026-12", "2026-11", OTHER_MODEL, "0.000406600", billing["csv_url"]):
        assert shown in page


def test_a_months_link_lists_the_batches_behind_it(staff, alice, bob):
    behind = entry(alice.org, date(2026, 12, 1), batch_id="batch_dec_main")
    entry(alice.org, date(2026, 12, 3), model=OTHER_MODEL, batch_id="batch_dec_other")
    entry(alice.org, date(2026, 11, 3), batch_id="batch_nov")
    entry(bob.org, date(2026, 12, 1), batch_id="batch_bob")
    month = staff.get(org_page(alice)).context["billing"]["months"][0]
    [model_row] = [r for r in month["models"] if r["model_name"] == MODEL]

    listed = staff.get(model_row["entries_url"])
    assert listed.status_code == 200
    assert [e.batch_id for e in listed.context["cl"].result_list] == [behind.batch_id]
    whole_month = staff.get(month["entries_url"]).context["cl"].result_list
    assert {e.batch_id for e in whole_month} == {"batch_dec_main", "batch_dec_other"}


def test_it_exports_the_organizations_ledger_as_csv(staff, alice, bob):
    entry(alice.org, date(2026, 12, 1), batch_id="batch_a")
    entry(alice.org, date(2026, 11, 1), model='=HYPERLINK("x")', batch_id="batch_b", tokens=(10, 0, 10))
    entry(bob.org, date(2026, 12, 1), batch_id="batch_bob")
    url = staff.get(org_page(alice)).context["billing"]["csv_url"]

    response = staff.get(url)

    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    assert 'filename="billing-alice-org.csv"' in response["Content-Disposition"]
    rows = csv_rows(response)
    assert [r["batch_id"] for r in rows] == ["batch_b", "batch_a"]  # oldest first
    expected = {
        "month": "2026-12",
        "batch_status": "completed",
        "model": MODEL,
        "priority": "standard",
        "input_tokens": "1000",
        "cached_tokens": "256",
        "output_tokens": "300",
        "cost_input_usd": "0.000074400",
        "cost_cached_input_usd": "0.000006400",
        "cost_output_usd": "0.000120000",
        "cost_total_usd": "0.000200800",
    }
    assert {name: rows[1][name] for name in expected} == expected
    assert rows[0]["model"] == '\'=HYPERLINK("x")'  # never a live formula in a spreadsheet


def test_only_staff_see_the_billing_export(client, alice):
    url = reverse("admin:openrelay_organization_billing_csv", args=[alice.org.pk])
    response = client.get(url)
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_an_unknown_organizations_export_is_404(staff):
    assert staff.get(reverse("admin:openrelay_organization_billing_csv", args=[999999])).status_code == 404


def test_the_add_page_has_no_billing_section(staff):
    response = staff.get(reverse("admin:openrelay_organization_add"))
    assert response.status_code == 200 and "billing" not in response.context
