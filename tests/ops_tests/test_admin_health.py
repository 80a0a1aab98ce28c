"""The admin's deployment and model pages: health, since when, last error without secrets,
calls in flight against the limit, calls a minute, error rate; each model's queue depth."""

import re

from django.test import Client

from batches.models import Engine
from openrelay.models import Deployment
from tests.conftest import make_persona
from tests.engine_tests.conftest import (  # noqa: F401 (fixtures)
    MODEL, _storage, chat, clusters, make_batch, model, sim, status_of, wait_for,
)
from tests.ops_tests.conftest import closed_port

KEY = "sk-upstream-Secret-0123456789abcdef"


def test_it_shows_a_failing_deployment_and_the_engines_calls(model, clusters, admin_user):
    dead = Deployment.objects.create(model=model, base_url=f"http://127.0.0.1:{closed_port()}/v1",
                                     upstream_model="m", api_key=KEY, max_concurrency=8)
    alice = make_persona("alice-org")
    batch = make_batch(alice.org, [chat(f"q {i}") for i in range(30)])
    clusters()
    wait_for(lambda: Deployment.objects.get(pk=dead.pk).health == "unhealthy", 30, "the dead deployment to leave")
    wait_for(lambda: status_of(batch) == "completed", 60, "the batch to complete on the live deployment")
    wait_for(lambda: any(calls for calls in Engine.objects.values_list("calls", flat=True)), 10, "published calls")
    client = Client()
    client.force_login(admin_user)

    page = client.get("/admin/openrelay/deployment/").content.decode()
    dead.refresh_from_db()
    assert dead.last_error and dead.health_changed_at
    assert "unhealthy" in page and dead.last_error in page
    assert KEY not in page and KEY.lower() not in page
    live = model.deployments.exclude(pk=dead.pk).get()
    assert "calls in flight / limit" in page.lower() and "error rate" in page.lower()
    # In flight against the adaptive limit, and the ceiling (max_concurrency) when the limit is below it.
    assert re.search(r"/ (16|\d+ \(max 16\))</td>", page) and re.search(r"/ (8|\d+ \(max 8\))</td>", page)

    change = client.get(f"/admin/openrelay/deployment/{dead.pk}/change/").content.decode()
    assert "unhealthy" in change.lower() and dead.last_error in change and KEY not in change
    live_change = client.get(f"/admin/openrelay/deployment/{live.pk}/change/").content.decode()
    assert "calls a minute" in live_change.lower()

    models = client.get("/admin/openrelay/model/").content.decode()
    # Both deployments' limits, nothing in flight.
    assert "queue depth" in models.lower() and re.search(r"0 / (24|\d+ \(max 24\))<", models)


def test_it_shows_each_models_queue_depth(model, admin_user):
    alice = make_persona("alice-org")
    batch = make_batch(alice.org, [chat(f"q {i}") for i in range(7)])
    batch.status = "in_progress"
    batch.save(update_fields=["status"])
    client = Client()
    client.force_login(admin_user)
    page = client.get("/admin/openrelay/model/").content.decode()
    assert '<td class="field-queue_depth">7</td>' in page
    change = client.get(f"/admin/openrelay/model/{model.pk}/change/").content.decode()
    assert "queue depth" in change.lower() and ">7<" in change
