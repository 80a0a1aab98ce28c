from decimal import Decimal, InvalidOperation

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from openrelay.core.models import Deployment, MessagesApi, Model, Price


def _price(value):
    try:
        price = Decimal(value)
    except InvalidOperation:
        raise CommandError(f"Not a price: {value!r} (USD per 1M tokens, e.g. 0.15)") from None
    if price < 0:
        raise CommandError("Prices cannot be negative.")
    return price


def _cached_price(value):
    # "none" clears a discount: cached input is then billed at the input price.
    return None if value.lower() in ("none", "") else _price(value)


class Command(BaseCommand):
    help = (
        "Create or update a model in the catalog with one deployment (idempotent: the deployment is "
        "found by base URL). Only the options given change; the rest stay as they are. Prices are USD "
        "per 1M tokens at the sync rate."
    )

    def add_arguments(self, parser):
        parser.add_argument("name", help="Public model name, e.g. openrelay/gemma-4-31b")
        parser.add_argument(
            "--base-url", required=True, help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8001/v1"
        )
        parser.add_argument(
            "--upstream-model",
            default=None,
            help="Model name sent upstream (a new deployment's default: the public name; '' sets it back to that)",
        )
        parser.add_argument("--api-key", default=None, help="Upstream API key (stored, never displayed)")
        parser.add_argument("--concurrency", type=int, default=None, help="Max concurrent calls to this deployment")
        parser.add_argument(
            "--messages-api",
            choices=[choice.value for choice in MessagesApi],
            default=None,
            help="Anthropic Messages records: 'translate' to chat completions (the default) or 'native' "
            "(the server's own /v1/messages: vLLM, llama.cpp, Ollama)",
        )
        parser.add_argument("--input-price", type=_price, default=None)
        parser.add_argument(
            "--cached-input-price",
            type=_cached_price,
            default=False,
            help="A discount for cached input tokens; 'none' clears it (billed at the input price)",
        )
        parser.add_argument("--output-price", type=_price, default=None)
        enabled = parser.add_mutually_exclusive_group()
        enabled.add_argument("--disable", action="store_true", help="Disable the model")
        enabled.add_argument("--enable", action="store_true", help="Enable a disabled model (a new one is enabled)")

    @transaction.atomic
    def handle(self, name, base_url, upstream_model, api_key, concurrency, disable, enable, messages_api, **options):
        if concurrency is not None and concurrency < 1:
            raise CommandError("--concurrency must be at least 1.")
        # An option left out keeps the stored value: `--concurrency 4` alone once reset the upstream
        # model name to the public name, and the next batch failed on the proxy's "Invalid model name".
        model, _ = Model.objects.get_or_create(name=name)
        if disable or enable:
            model.enabled = enable
            model.save(update_fields=["enabled"])
        deployment, created = Deployment.objects.get_or_create(model=model, base_url=base_url)
        if upstream_model is not None:
            deployment.upstream_model = upstream_model
        if api_key is not None:
            deployment.api_key = api_key
        if concurrency is not None:
            deployment.max_concurrency = concurrency
        if messages_api is not None:
            deployment.messages_api = messages_api
        deployment.save()
        price, _ = Price.objects.get_or_create(model=model)
        for field, option in (("input_per_mtok", "input_price"), ("output_per_mtok", "output_price")):
            if options[option] is not None:
                setattr(price, field, options[option])
        if options["cached_input_price"] is not False:  # given, perhaps as "none"
            price.cached_input_per_mtok = options["cached_input_price"]
        price.save()
        verb = "Added" if created else "Updated"
        self.stdout.write(
            f"{verb} {model.name} -> {deployment.base_url} (upstream {deployment.upstream_name}, "
            f"concurrency {deployment.max_concurrency}); prices per 1M tokens: input {price.input_per_mtok}, "
            f"cached input {price.effective_cached_input_per_mtok}"
            f"{' (the input price)' if price.cached_input_per_mtok is None else ''}, output {price.output_per_mtok}"
        )
