"""schemathesis, every check, against the served OpenAPI document of a live uvicorn process: the
document and the server as a client meets them (our HTTP protocol, the ASGI handler, the middleware),
not only through the WSGI handler in-process (tests/reliability_tests/test_schema.py, more examples)."""

import os

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from tests.helpers import make_persona

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def live_schema(uvicorn_server):
    return schemathesis.openapi.from_url(f"{uvicorn_server.url}/v1/openapi.json")


@pytest.fixture
def api_key(transactional_db):
    return make_persona("schemathesis-live-org").key


schema = schemathesis.pytest.from_fixture("live_schema").include(path_regex=r"^/v1/")


@schema.parametrize()
@settings(
    max_examples=int(os.environ.get("OPENRELAY_LIVE_FUZZ_EXAMPLES", "5")),
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=not os.environ.get("OPENRELAY_FUZZ_RANDOM"),
)
def test_the_live_server_against_its_schema(case, api_key):
    # Every check; what a schema cannot state is in schemathesis.toml (see the in-process test).
    case.call_and_validate(headers={"Authorization": f"Bearer {api_key}"}, timeout=30)
