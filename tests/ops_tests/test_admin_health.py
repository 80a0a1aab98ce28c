"""The admin's deployment and model pages: health, since when, last error without secrets,
calls in flight against the limit, calls a minute, error rate; each model's queue depth."""

import re

import pytest
from django.test import Client

from batches.models import Engine
from openrelay.core.models import Deployment
from tests.helpers import chat, make_batch, make_persona, status_of, wait_for
from tests.ops_tests.conftest import closed_port

pytestmark = pytest.mark.usefixtures("tmp_storage")  # stored files in tmp_path (tests/fixtures/storage.py)

KEY = "sk-upstream-Secret-0123456789abcdef"


def test_it_shows_a_failing_deployment_and_the_engines_calls(model, clusters, admin_user):
    dead = Deployment.objects.create(
        model=model, base_url=f"http://127.0.0.1:{closed_port()}/v1", upstream_model="m", api_key=KEY, max_concurrency=8
    )
    alice = make_persona("alice-org")
    batch = make_batch(alice.org, [chat(f"q {i}") for i in range(30)])
    clusters()
    wait_for(lambda: Deployment.objects.get(pk=dead.pk).health == "unhealthy", 30, "the dead deployment to leave")
    wait_for(lambda: status_of(batch) == "completed", 60, "the batch to complete on the live deployment")
    live = model.deployments.exclude(pk=dead.pk).get()

    def calls_a_minute(deployment):
        return sum(
            (calls.get(str(deployment.pk)) or [0, 0])[1] for calls in Engine.objects.values_list("calls", flat=True)
        )

    # Each engine publishes its last minute with its heartbeat (every 0.5 s): a beat after the batch ends.
    wait_for(lambda: calls_a_minute(dead) > 0 and calls_a_minute(live) == 30, 10, "published calls")
    client = Client()
    client.force_login(admin_user)

    page = client.get("/admin/openrelay/deployment/").content.decode()
    dead.refresh_from_db()
    assert dead.last_error and dead.health_changed_at
    assert "unhealthy" in page and dead.last_error in page
    assert KEY not in page and KEY.lower() not in page
    assert "calls in flight / limit" in page.lower() and "error rate" in page.lower()
    # In flight against the adaptive limit, and the ceiling (max_concurrency) when the limit is below it.
    assert re.search(r"/ (16|\d+ \(max 16\))</td>", page) and re.search(r"/ (8|\d+ \(max 8\))</td>", page)
    # Since when, and the error rate of each: the dead one only failed, the live one only answered 2xx.
    rows = {pk: re.search(rf'value="{pk}".*?</tr>', page, re.S).group(0) for pk in (dead.pk, live.pk)}
    assert re.search(r"field-health_changed_at[^>]*>(?!-<)[^<]+<", rows[dead.pk])
    assert 'field-error_rate">100.0%<' in rows[dead.pk] and 'field-error_rate">0.0%<' in rows[live.pk]
    # up, failing (in the rotation, calls failed in the last minute), down (out, probed) or disabled.
    assert 'field-state">down<' in rows[dead.pk] and 'field-state">up<' in rows[live.pk]

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
