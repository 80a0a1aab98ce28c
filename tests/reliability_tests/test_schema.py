"""The OpenAPI schema at /v1/openapi.json: generated correctly, covering every /v1/
route, and schemathesis against it finds no 5xx and no answer outside the schema."""

import os
import re

import orjson
import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from django.urls import URLPattern, URLResolver, get_resolver
from hypothesis import HealthCheck, settings
from rest_framework.test import APIClient

from batches import windows
from batches.validation import params
from tests.helpers import make_persona

SCHEMA_URL = "/v1/openapi.json"
# Routes whose shapes this project states (openrelay/api/openapi.py); other /v1/ routes must at least be listed.
DESCRIBED_PREFIXES = (
    "/v1/files",
    "/v1/batches",
    "/v1/models",
    "/v1/limits",
    "/v1/webhook_endpoints",
    "/v1/webhook_event_types",
)


def _schema():
    response = APIClient().get(SCHEMA_URL)
    assert response.status_code == 200, response.content[:300]
    return orjson.loads(response.content)


def _v1_routes():
    """(OpenAPI path, method) for every /v1/ route the URLconf serves, from the views themselves."""
    routes = set()

    def walk(patterns, prefix):
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, prefix + str(pattern.pattern))
            elif isinstance(pattern, URLPattern):
                path = "/" + prefix + str(pattern.pattern)
                if not path.startswith("/v1/") or path == SCHEMA_URL:
                    continue
                view = getattr(pattern.callback, "view_class", None) or getattr(pattern.callback, "cls", None)
                methods = [m for m in ("get", "post", "put", "patch", "delete") if hasattr(view, m)]
                openapi_path = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", path)
                routes.update((openapi_path, method) for method in methods)

    walk(get_resolver().url_patterns, "")
    return routes


def test_it_is_served_as_json_to_anyone():
    response = APIClient().get(SCHEMA_URL)
    assert response.status_code == 200
    assert "json" in response["Content-Type"]
    schema = orjson.loads(response.content)
    assert schema["openapi"].startswith("3.")
    assert schema["info"]["title"] == "OpenRelay Batch API"


def test_it_covers_every_v1_route():
    schema = _schema()
    listed = {(path, method) for path, ops in schema["paths"].items() for method in ops}
    routes = _v1_routes()
    assert ("/v1/batches", "post") in routes and ("/v1/files/{file_id}/content", "get") in routes
    assert routes <= listed, f"routes missing from the schema: {sorted(routes - listed)}"


def test_files_batches_and_webhook_operations_are_described():
    schema = _schema()
    assert schema["components"]["securitySchemes"]["ApiKeyAuth"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "An organization API key: `Bearer or_...`.",
    }
    operation_ids = []
    for path, operations in schema["paths"].items():
        if not path.startswith(DESCRIBED_PREFIXES):
            continue
        for method, operation in operations.items():
            operation_ids.append(operation["operationId"])
            assert operation["security"] == [{"ApiKeyAuth": []}], (path, method)
            responses = operation["responses"]
            assert "200" in responses and "401" in responses, (path, method)
            for status, response in responses.items():
                if status != "200":
                    assert response["content"]["application/json"]["schema"] == {
                        "$ref": "#/components/schemas/Error"
                    }, (path, method, status)
    assert sorted(operation_ids) == sorted(
        [
            "batches_create",
            "batches_estimate",
            "batches_list",
            "batches_retrieve",
            "batches_cancel",
            "batches_pause",
            "batches_resume",
            "batches_retry",
            "batches_results",
            "models_list",
            "models_retrieve",
            "limits_retrieve",
            "files_create",
            "files_list",
            "files_retrieve",
            "files_delete",
            "files_content",
            "webhook_endpoints_create",
            "webhook_endpoints_list",
            "webhook_endpoints_retrieve",
            "webhook_endpoints_update",
            "webhook_endpoints_delete",
            "webhook_endpoints_rotate_secret",
            "webhook_endpoints_test",
            "webhook_event_types_list",
        ]
    )
    create = schema["paths"]["/v1/batches"]["post"]
    assert "429" in create["responses"] and "413" in create["responses"]


def test_the_create_schema_matches_the_validation_rules():
    properties = _schema()["components"]["schemas"]["BatchCreate"]["properties"]
    assert set(properties) == set(params.CREATE_PARAMS)
    assert properties["endpoint"]["enum"] == list(params.ENDPOINTS)
    assert properties["completion_window"]["enum"] == windows.names()
    assert properties["priority"]["enum"] == list(params.PRIORITIES)
    assert properties["metadata"]["maxProperties"] == params.MAX_METADATA_PAIRS
    assert properties["metadata"]["additionalProperties"]["maxLength"] == params.MAX_METADATA_VALUE
    seconds = properties["output_expires_after"]["properties"]["seconds"]
    assert (seconds["minimum"], seconds["maximum"]) == params.OUTPUT_EXPIRY_RANGE


# --- schemathesis --------------------------------------------------------------------------


@pytest.fixture
def api_schema(db):
    # Like Django's test client: keep the test's connection (and its transaction)
    # open across requests made straight through the WSGI handler.
    for signal in (request_started, request_finished):
        signal.disconnect(close_old_connections)
    try:
        yield schemathesis.openapi.from_wsgi(SCHEMA_URL, get_wsgi_application())
    finally:
        for signal in (request_started, request_finished):
            signal.connect(close_old_connections)


@pytest.fixture
def api_key(db):
    return make_persona("schemathesis-org").key


schema = schemathesis.pytest.from_fixture("api_schema").include(path_regex=r"^/v1/")


@schema.parametrize()
@settings(
    max_examples=int(os.environ.get("OPENRELAY_FUZZ_EXAMPLES", "25")),
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=not os.environ.get("OPENRELAY_FUZZ_RANDOM"),
)
def test_the_api_against_its_schema(case, api_key):
    # Every check schemathesis has (--checks all): no 5xx, documented statuses, content types, headers
    # and bodies as the schema says, methods and auth honoured, schema-valid input accepted and
    # schema-invalid input refused. What a schema cannot state (a webhook URL's host must resolve, an
    # upload must be JSONL text) is listed per operation in schemathesis.toml, each with its reason.
    case.call_and_validate(headers={"Authorization": f"Bearer {api_key}"})


def test_an_empty_value_is_a_value_not_an_absent_parameter(db):
    """`?order=`, `?kind=`, `?start=`, `?limit=` and `"url": null` are refused as the schema says, never read
    as "not given" (schemathesis's negative cases found each one taken as the default)."""
    persona = make_persona("empty-values-org")
    client = persona.client
    for path, param in (
        ("/v1/files?order=", "order"),
        ("/v1/files?limit=", "limit"),
        ("/v1/batches?limit=", "limit"),
        ("/v1/organization/usage?start=", "start"),
    ):
        response = client.get(path)
        assert response.status_code == 400 and response.json()["error"]["param"] == param, (path, response.content)
    batch = client.post(
        "/v1/batches",
        {
            "requests": [{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        },
        format="json",
    ).json()
    response = client.get(f"/v1/batches/{batch['id']}/results?kind=")
    assert response.status_code == 400 and response.json()["error"]["param"] == "kind"
    endpoint = client.post(
        "/v1/webhook_endpoints",
        {"name": "n", "url": "https://hooks.example.com/x", "event_types": ["batch.completed"]},
        format="json",
    )
    assert endpoint.status_code == 200, endpoint.content
    response = client.post(f"/v1/webhook_endpoints/{endpoint.json()['id']}", {"url": None}, format="json")
    assert response.status_code == 400 and response.json()["error"]["param"] == "url"
