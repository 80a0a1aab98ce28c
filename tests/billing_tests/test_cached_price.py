"""Cached input is billed at the input price unless an operator sets a cached price.

A model server's prompt cache is its own business: llama.cpp reported 7,090
of 7,290 input tokens cached, and a default cached price of 0 made them free.
"""

from decimal import Decimal

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.urls import reverse

from batches.engine.runner import run_batch
from billing.models import LedgerEntry
from openrelay.core.models import Price
from tests.billing_tests.conftest import LONG, PRICE_INPUT, PRICE_OUTPUT, create, oracle_cost
from tests.helpers import MODEL, chat


@pytest.fixture
def unset_cached_price(model):
    Price.objects.filter(model=model).update(cached_input_per_mtok=None)
    return model


def test_it_bills_cached_tokens_at_the_input_price_when_no_cached_price_is_set(alice, unset_cached_price):
    batch = create(alice, [chat(LONG), chat(LONG + " again")])
    run_batch(batch.pk)

    entry = LedgerEntry.objects.get(batch_id=batch.public_id)
    assert entry.cached_tokens > 0
    assert entry.price_cached_input == PRICE_INPUT
    expected = oracle_cost(
        entry.input_tokens, entry.cached_tokens, entry.output_tokens, prices=(PRICE_INPUT, PRICE_INPUT, PRICE_OUTPUT)
    )
    assert (
        entry.input_cost_nanos,
        entry.cached_input_cost_nanos,
        entry.output_cost_nanos,
        entry.total_cost_nanos,
    ) == expected
    # The same as if no token had been cached.
    assert entry.total_cost_nanos == sum(
        oracle_cost(entry.input_tokens, 0, entry.output_tokens, prices=(PRICE_INPUT, PRICE_INPUT, PRICE_OUTPUT))[:3]
    )


def test_a_cached_price_the_operator_sets_is_a_discount(alice, model):
    batch = create(alice, [chat(LONG)])
    run_batch(batch.pk)
    entry = LedgerEntry.objects.get(batch_id=batch.public_id)
    assert entry.cached_tokens > 0 and entry.price_cached_input == Decimal("0.05")
    assert entry.cached_input_cost_nanos < oracle_cost(entry.cached_tokens, 0, 0)[0]


def test_the_models_route_shows_the_effective_cached_price(alice, unset_cached_price):
    price = alice.client.get(f"/v1/models/{MODEL}").json()["openrelay"]["price_per_mtok"]
    assert price == {"input": "0.200000", "cached_input": "0.200000", "output": "0.800000"}


def test_the_admin_shows_the_effective_cached_price_and_can_clear_a_discount(client, admin_user, model):
    client.force_login(admin_user)
    price = Price.objects.get(model=model)
    response = client.post(
        reverse("admin:openrelay_price_change", args=[price.pk]),
        {"model": model.pk, "input_per_mtok": "0.2", "cached_input_per_mtok": "", "output_per_mtok": "0.8"},
    )
    assert response.status_code == 302
    price.refresh_from_db()
    assert price.cached_input_per_mtok is None and price.effective_cached_input_per_mtok == Decimal("0.2")
    page = client.get(reverse("admin:openrelay_price_changelist")).content.decode()
    assert "0.200000 (the input price)" in page


def test_set_model_can_set_and_clear_the_cached_price(db):
    from django.core.management import call_command

    call_command(
        "set_model", MODEL, "--base-url", "http://127.0.0.1:9/v1", "--input-price", "0.3", "--cached-input-price", "0.1"
    )
    assert Price.objects.get(model__name=MODEL).effective_cached_input_per_mtok == Decimal("0.1")
    call_command("set_model", MODEL, "--base-url", "http://127.0.0.1:9/v1", "--cached-input-price", "none")
    price = Price.objects.get(model__name=MODEL)
    assert price.cached_input_per_mtok is None and price.effective_cached_input_per_mtok == Decimal("0.3")


@pytest.mark.django_db(transaction=True)
def test_the_migration_turns_the_old_default_of_zero_into_no_discount():
    """A cached price of 0 was the column's default, indistinguishable from "never set": it becomes
    unset (the input price). A cached price an operator set above 0 stays as the discount."""
    executor = MigrationExecutor(connection)
    # Going back to billing 0002 also unapplies the core migrations that depend on it (core 0005 on):
    # forward again to every app's leaf, or later tests meet a schema missing their columns.
    before, after = [("billing", "0002_ledger_nanos_and_price_snapshot")], executor.loader.graph.leaf_nodes()
    executor.migrate(before)
    old = executor.loader.project_state(before).apps
    OldModel, OldPrice = old.get_model("openrelay", "Model"), old.get_model("billing", "Price")
    defaulted = OldPrice.objects.create(
        model=OldModel.objects.create(name="a"),
        input_per_mtok=Decimal("0.2"),
        cached_input_per_mtok=Decimal("0"),
        output_per_mtok=Decimal("0.8"),
    )
    discounted = OldPrice.objects.create(
        model=OldModel.objects.create(name="b"),
        input_per_mtok=Decimal("0.2"),
        cached_input_per_mtok=Decimal("0.05"),
        output_per_mtok=Decimal("0.8"),
    )

    executor = MigrationExecutor(connection)
    # Every app's leaves, not billing's alone: going back to billing 0002 also undid the later
    # migrations of the apps that depend on it, which the tests after this one need.
    executor.migrate(after + [leaf for leaf in executor.loader.graph.leaf_nodes() if leaf not in after])

    assert Price.objects.get(pk=defaulted.pk).cached_input_per_mtok is None
    assert Price.objects.get(pk=discounted.pk).cached_input_per_mtok == Decimal("0.05")
