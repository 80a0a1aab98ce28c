"""GET /v1/models and /v1/limits: what a user can see before submitting, true to what is enforced."""

from decimal import Decimal

import openai
import pytest

from batches.validation import jsonl, params
from openrelay.core.models import Deployment, Model, Price


@pytest.fixture
def catalog(db):
    gemma = Model.objects.create(name="openrelay/gemma-4-31b")
    Deployment.objects.create(model=gemma, base_url="http://a.example/v1", max_concurrency=48)
    Deployment.objects.create(model=gemma, base_url="http://b.example/v1", max_concurrency=16)
    Deployment.objects.create(model=gemma, base_url="http://c.example/v1", max_concurrency=99, enabled=False)
    Price.objects.create(
        model=gemma,
        input_per_mtok=Decimal("0.2"),
        cached_input_per_mtok=Decimal("0.05"),
        output_per_mtok=Decimal("0.8"),
    )
    Model.objects.create(name="openrelay/embed-small")  # no price, no deployment yet
    Model.objects.create(name="openrelay/retired", enabled=False)


def test_the_openai_sdk_lists_and_retrieves_the_enabled_models(alice, catalog, live_server):
    client = openai.OpenAI(api_key=alice.key, base_url=f"{live_server.url}/v1", max_retries=0)

    listed = client.models.list()

    assert [m.id for m in listed.data] == ["openrelay/embed-small", "openrelay/gemma-4-31b"]
    gemma = client.models.retrieve("openrelay/gemma-4-31b")
    assert (gemma.object, gemma.owned_by) == ("model", "openrelay")
    extra = gemma.model_extra["openrelay"]
    assert extra["max_concurrency"] == 64
    assert extra["price_per_mtok"] == {"input": "0.200000", "cached_input": "0.050000", "output": "0.800000"}
    assert extra["priority_multiplier"] == {"standard": "0.5", "expedited": "1.0"}
    assert client.models.retrieve("openrelay/embed-small").model_extra["openrelay"]["price_per_mtok"] is None
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("openrelay/retired")


def test_the_concurrency_limit_is_what_the_live_engines_hold_now(alice, catalog):
    """max_concurrency is the ceiling; concurrency_limit the engines' adaptive limits summed (batches.engine.calls.flow),
    the ceiling again for a deployment no engine works."""
    from django.utils import timezone

    from batches.models import Engine

    a = Deployment.objects.get(base_url="http://a.example/v1")
    now = timezone.now()
    Engine.objects.create(owner="host:1:a", seen_at=now, calls={str(a.pk): [3, 10, 0, 12]})
    Engine.objects.create(owner="host:2:b", seen_at=now, calls={str(a.pk): [2, 10, 0, 9]})
    Engine.objects.create(
        owner="host:3:dead", seen_at=now - timezone.timedelta(minutes=5), calls={str(a.pk): [0, 0, 0, 40]}
    )
    extra = alice.client.get("/v1/models/openrelay/gemma-4-31b").json()["openrelay"]
    assert (extra["max_concurrency"], extra["concurrency_limit"]) == (64, 12 + 9 + 16)
    listed = {m["id"]: m["openrelay"] for m in alice.client.get("/v1/models").json()["data"]}
    assert listed["openrelay/gemma-4-31b"]["concurrency_limit"] == 37
    assert listed["openrelay/embed-small"]["concurrency_limit"] == 0  # no deployment


def test_an_unknown_model_is_a_coded_404(alice, catalog):
    response = alice.client.get("/v1/models/nobody/unknown")
    assert response.status_code == 404
    assert (response.json()["error"]["code"], response.json()["error"]["param"]) == ("model_not_found", "model")


def test_the_limits_are_the_ones_enforced(alice, settings):
    settings.OPENRELAY_BATCH_CREATE_RATE = "50/minute"
    limits = alice.client.get("/v1/limits").json()

    assert limits["object"] == "openrelay.limits"
    batch = limits["batch"]
    assert (batch["max_requests"], batch["max_line_bytes"]) == (jsonl.MAX_RECORDS, jsonl.MAX_LINE_BYTES)
    assert batch["max_file_bytes"] == settings.OPENRELAY_MAX_UPLOAD_BYTES
    assert batch["endpoints"] == list(params.ENDPOINTS) and batch["create_rate"] == "50/minute"
    assert limits["tool_config"]["max_rounds"] == {"default": 8, "max": 16}
    assert limits["workflow"] is None  # workflows are off for alice's organization
    assert limits["organization"] == {"workflows_enabled": False, "max_concurrency": None, "budget": None}


def test_an_organizations_own_limits_show(db):
    from tests.helpers import make_persona

    carol = make_persona("carol-org", workflows_enabled=True, max_concurrency=12)
    limits = carol.client.get("/v1/limits").json()
    assert limits["organization"] == {"workflows_enabled": True, "max_concurrency": 12, "budget": None}
    assert limits["workflow"]["max_steps"] == {"default": 8, "max": 64}
