"""GET /healthz and /readyz: unauthenticated, any Host, 503 naming what is unreachable and nothing more."""

import pytest
from django.conf import settings as django_settings

from tests.helpers import database_url
from tests.ops_tests.conftest import closed_port


def test_it_answers_ready_when_the_database_and_broker_answer(client, db):
    health = client.get("/healthz")
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json() == {"status": "ready"}
    assert ready["Cache-Control"] == "no-store"


def test_it_refuses_other_methods(client, db):
    response = client.post("/readyz")
    assert response.status_code == 405 and response["Allow"] == "GET, HEAD"


@pytest.mark.parametrize("unreachable", ["postgres", "sqlite"])
def test_it_turns_503_naming_the_database_when_it_is_unreachable(web, tmp_path, unreachable):
    port = closed_port()
    url = (
        f"postgres://openrelay:hunter2-secret@127.0.0.1:{port}/openrelay"
        if unreachable == "postgres"
        else f"sqlite:///{tmp_path}/no-such-folder/openrelay.sqlite3"
    )
    process = web(DATABASE_URL=url, REDIS_URL="")
    assert process.get("/healthz").status_code == 200  # the process answers: no restart for a database outage
    ready = process.get("/readyz")
    assert ready.status_code == 503
    # Without REDIS_URL the task broker is django-q2's ORM broker: the same database.
    assert ready.json() == {"status": "unavailable", "unavailable": ["database", "broker"]}
    for leak in (str(port), "hunter2", "openrelay:", "no-such-folder"):
        assert leak not in ready.text


@pytest.mark.skipif(not django_settings.REDIS_URL, reason="the production configuration: needs Redis")
def test_it_turns_503_naming_only_the_database_when_redis_still_answers(web, transactional_db):
    # The production configuration: PostgreSQL gone, the Redis broker up.
    process = web(
        DATABASE_URL=f"postgres://openrelay:hunter2-secret@127.0.0.1:{closed_port()}/openrelay",
        REDIS_URL=django_settings.REDIS_URL,
    )
    ready = process.get("/readyz")
    assert ready.status_code == 503
    assert ready.json() == {"status": "unavailable", "unavailable": ["database"]}
    assert "hunter2" not in ready.text


def test_it_turns_503_naming_the_broker_when_redis_is_unreachable(web, transactional_db):
    process = web(DATABASE_URL=database_url(), REDIS_URL=f"redis://127.0.0.1:{closed_port()}/0")
    ready = process.get("/readyz")
    assert ready.status_code == 503
    assert ready.json() == {"status": "unavailable", "unavailable": ["broker"]}


def test_it_answers_probes_whatever_the_host(web, transactional_db):
    # Kubernetes sends the pod's IP as the Host; ALLOWED_HOSTS names the public host only.
    process = web(DATABASE_URL=database_url(), REDIS_URL="", ALLOWED_HOSTS="batch.example.com")
    assert process.get("/readyz", headers={"Host": "10.1.2.3:8000"}).status_code == 200
    assert process.get("/healthz", headers={"Host": "10.1.2.3:8000"}).status_code == 200
    assert process.get("/v1/batches", headers={"Host": "10.1.2.3:8000"}).status_code == 400
