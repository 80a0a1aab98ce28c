"""`{% model_prices %}`: the models a record may name, at the prices a batch on them is billed.

The prices are the catalog's own (batches.catalog.model_object, what /v1/models
answers), so the dashboard never shows a price the API does not.
"""

from django import template

from batches.catalog import enabled_models, model_object

register = template.Library()


@register.inclusion_tag("dashboard/_model_prices.html")
def model_prices():
    from batches.dashboard.display import money

    rows = []
    for model in enabled_models():
        prices = model_object(model)["openrelay"]["price_per_mtok"]
        if prices is not None:
            prices = {name: money(amount, "usd") for name, amount in prices.items()}
            prices["cached_is_input"] = model.price.cached_input_per_mtok is None
        rows.append({"name": model.name, "prices": prices})
    return {"models": rows}
