"""`manage.py set_model`: an option left out keeps what is stored (issue 33: `--concurrency 4` alone
reset the upstream model name, and the next batch failed 3 of 3 on the proxy's 400)."""

from decimal import Decimal
from io import StringIO

from django.core.management import call_command

from openrelay.core.models import Deployment, Model

URL = "http://127.0.0.1:9/v1"


def _set(*args):
    call_command("set_model", "openrelay/gemma-4-31b", "--base-url", URL, *args, stdout=StringIO())


def test_it_changes_only_the_settings_it_is_given(db):
    _set("--upstream-model", "google/gemma-4-31b-it", "--api-key", "sk-up", "--concurrency", "64")
    _set("--input-price", "0.2", "--output-price", "0.8", "--cached-input-price", "0.05")

    _set("--concurrency", "4")

    deployment = Deployment.objects.get()
    assert (deployment.upstream_model, deployment.api_key, deployment.max_concurrency) == (
        "google/gemma-4-31b-it",
        "sk-up",
        4,
    )
    price = deployment.model.price
    assert (price.input_per_mtok, price.cached_input_per_mtok, price.output_per_mtok) == (
        Decimal("0.2"),
        Decimal("0.05"),
        Decimal("0.8"),
    )


def test_a_disabled_model_stays_disabled_until_enabled_and_an_empty_upstream_name_means_the_public_one(db):
    _set("--upstream-model", "google/gemma-4-31b-it", "--disable")
    _set("--concurrency", "8")
    assert Model.objects.get().enabled is False
    _set("--enable", "--upstream-model", "")
    assert Model.objects.get().enabled is True
    assert Deployment.objects.get().upstream_name == "openrelay/gemma-4-31b"


def test_a_new_deployment_of_a_model_is_enabled_with_the_public_name_upstream(db):
    _set()
    deployment = Deployment.objects.get()
    assert deployment.model.enabled and deployment.upstream_name == "openrelay/gemma-4-31b"
