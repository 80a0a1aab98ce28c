"""The new-batch page shows the models a record may name, at their effective prices."""

from decimal import Decimal

from openrelay.core.models import Model, Price


def test_the_new_batch_page_shows_each_models_effective_prices(alice_client, gemma):
    Price.objects.create(model=gemma, input_per_mtok=Decimal("0.2"), output_per_mtok=Decimal("0.8"))
    discounted = Model.objects.create(name="openrelay/discounted")
    Price.objects.create(
        model=discounted,
        input_per_mtok=Decimal("0.3"),
        cached_input_per_mtok=Decimal("0.1"),
        output_per_mtok=Decimal("1.2"),
    )
    Model.objects.create(name="openrelay/unpriced")
    Model.objects.create(name="openrelay/retired", enabled=False)

    page = alice_client.get("/batches/new").content.decode()

    models = page.split("data-models")[1]
    assert "openrelay/retired" not in models
    gemma_row = models.split(gemma.name)[1].split("</tr>")[0]
    # No cached price set: cached input costs what input costs.
    assert [cell in gemma_row for cell in ("$0.20", "$0.20 (the input price)", "$0.80")] == [True] * 3
    discounted_row = models.split("openrelay/discounted")[1].split("</tr>")[0]
    assert "$0.10" in discounted_row and "input price" not in discounted_row
    assert "not priced" in models.split("openrelay/unpriced")[1].split("</tr>")[0]
