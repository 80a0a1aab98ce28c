"""The operator page: staff only; models, deployments, the engines' calls, queues, running batches by organization."""

import re

import pytest
from asgiref.sync import async_to_sync
from django.test import Client
from django.utils import timezone

from batches.dashboard import consumers
from batches.models import Engine, Record, RecordStatus
from openrelay.core.models import Deployment, Model
from tests.dashboard_tests.conftest import make_member, session_of, socket
from tests.helpers import make_batch

# The sockets of these tests, each on a channel layer of its own (conftest.fresh_layer).
pytestmark = pytest.mark.usefixtures("fresh_layer")


@pytest.fixture
def operator_user(alice, django_user_model):
    user = make_member(django_user_model, "root", alice.org)
    user.is_staff = True
    user.save(update_fields=["is_staff"])
    return user


@pytest.fixture
def fleet(alice, bob):
    """Two models, three deployments (one failing), two engines' calls, batches of two organizations."""
    gemma, embed = Model.objects.create(name="openrelay/gemma-4-31b"), Model.objects.create(name="openrelay/embed")
    first = Deployment.objects.create(model=gemma, base_url="http://10.0.0.1:8000/v1", max_concurrency=32)
    second = Deployment.objects.create(
        model=gemma,
        base_url="http://10.0.0.2:8000/v1",
        max_concurrency=16,
        health="unhealthy",
        health_changed_at=timezone.now(),
        last_error="The model server failed: ConnectError.",
    )
    Deployment.objects.create(model=embed, base_url="http://10.0.0.3:8000/v1", max_concurrency=8)
    now = timezone.now()
    Engine.objects.create(owner="host:1:a", seen_at=now, calls={str(first.pk): [10, 600, 6]})
    Engine.objects.create(owner="host:2:b", seen_at=now, calls={str(first.pk): [7, 400, 4], str(second.pk): [0, 9, 9]})
    Engine.objects.create(
        owner="host:3:dead", seen_at=now - timezone.timedelta(minutes=1), calls={str(first.pk): [99, 99, 99]}
    )
    mine = make_batch(alice.org, total=100, completed=40, model=gemma)
    theirs = make_batch(bob.org, total=50, completed=10, failed=5, model=gemma)
    make_batch(bob.org, status="completed", total=5, completed=5, model=gemma)  # finished: not running
    Record.objects.bulk_create(
        [
            Record(batch=mine, line=i, custom_id=str(i), offset=0, length=1, status=RecordStatus.RUNNING)
            for i in range(12)
        ]
    )
    return {"first": first, "second": second, "mine": mine, "theirs": theirs}


def test_it_refuses_anyone_but_staff(alice_client, db):
    assert Client().get("/operator").status_code == 302  # to the sign-in form
    assert alice_client.get("/operator").status_code == 403
    assert "Operator" not in alice_client.get("/").content.decode().split("<main>")[0]


def test_it_shows_every_deployment_with_the_live_engines_calls_queues_and_running_batches(
    client, operator_user, fleet, django_assert_max_num_queries
):
    client.force_login(operator_user)
    with django_assert_max_num_queries(9):
        page = client.get("/operator").content.decode()
    first = re.search(rf'data-deployment="{fleet["first"].pk}".*?</tr>', page, re.S).group(0)
    assert (
        '17</span> / <span data-field="limit">32</span>' in first
    )  # 10 + 7 in flight; the dead engine's 99 not counted
    assert '<td class="num" data-field="calls_a_minute">1000</td>' in first
    assert '<td class="num" data-field="error_rate">1.0%</td>' in first
    second = re.search(rf'data-deployment="{fleet["second"].pk}".*?</tr>', page, re.S).group(0)
    assert "unhealthy" in second and "ConnectError" in second and "100.0%" in second
    # In the rotation but with calls failed in the last minute: marked failing; the one out of it is not "failing".
    assert 'data-field="state"' in first and ">failing<" in first and ">failing<" not in second
    gemma = re.search(r'data-model="openrelay/gemma-4-31b".*?</tr>', page, re.S).group(0)
    assert '17</span> / <span data-field="limit">48</span>' in gemma  # against both deployments' limits
    assert '<td class="num" data-field="records_in_flight">12</td>' in gemma
    assert '<td class="num" data-field="queued">83</td>' in gemma  # 150 - 55 done - 12 leased
    assert 'data-model="openrelay/embed"' in page
    assert "2 engines live" in page
    # Deployments by number, linked to their admin pages: no address or upstream name on a dashboard page.
    assert f"/admin/openrelay/deployment/{fleet['first'].pk}/change/" in first
    assert "10.0.0." not in page
    alice_block = re.search(r'data-organization="alice-org".*?</table>', page, re.S).group(0)
    assert fleet["mine"].public_id in alice_block and fleet["theirs"].public_id not in alice_block
    assert 'data-organization="bob-org"' in page and page.count("data-running-batch=") == 2


@pytest.mark.django_db(transaction=True)
def test_the_operator_socket_is_for_staff_only_and_pushes_the_figures(alice_user, operator_user, fleet):
    member, staff = session_of(alice_user), session_of(operator_user)

    async def test():
        connected, code = await socket("/ws/operator").connect()
        assert (connected, code) == (False, consumers.NOT_SIGNED_IN)
        connected, code = await socket("/ws/operator", member).connect()
        assert (connected, code) == (False, consumers.NOT_STAFF)
        ws = socket("/ws/operator", staff)
        assert (await ws.connect())[0]
        message = await ws.receive_json_from(timeout=5)
        assert (
            message["type"] == "operator.updated"
            and '17</span> / <span data-field="limit">32</span>' in message["html"]
        )
        await ws.disconnect()

    async_to_sync(test)()


def test_it_shows_the_adaptive_limit_and_the_ceiling_it_is_under(client, operator_user, db):
    """Engines publish their adaptive limit at each deployment (the fourth figure): the page shows
    calls in flight against it, and max_concurrency beside it while it is lower."""
    gemma = Model.objects.create(name="openrelay/gemma-4-31b")
    deployment = Deployment.objects.create(model=gemma, base_url="http://10.0.0.1:8000/v1", max_concurrency=64)
    now = timezone.now()
    Engine.objects.create(owner="host:1:a", seen_at=now, calls={str(deployment.pk): [9, 100, 0, 10]})
    Engine.objects.create(owner="host:2:b", seen_at=now, calls={str(deployment.pk): [8, 100, 0, 12]})
    client.force_login(operator_user)
    page = client.get("/operator").content.decode()
    row = re.search(rf'data-deployment="{deployment.pk}".*?</tr>', page, re.S).group(0)
    assert '17</span> / <span data-field="limit">22</span> <span class="muted">(max 64)</span>' in row
