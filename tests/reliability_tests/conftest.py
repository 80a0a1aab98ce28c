"""Shared helpers for the reliability and security tests.

The real user-URL servers they call (a tool executor, a workflow callback,
the official MCP server requiring a bearer token) are tests/fixtures/'s.
"""

import orjson
import pytest

from openrelay.core.models import Deployment, Model
from tests.helpers import CHAT, MODEL

ERROR_KEYS = {"message", "type", "param", "code"}


@pytest.fixture(autouse=True)
def _storage(tmp_storage):
    """Every reliability test keeps its stored files in tmp_path."""


@pytest.fixture
def catalog(db):
    """The model records name; its deployment is never called by create-only tests."""
    model = Model.objects.create(name=MODEL)
    Deployment.objects.create(model=model, base_url="http://127.0.0.1:9/v1", upstream_model="sim-upstream")
    return model


def assert_envelope(response, status=None, code=None):
    """The response is an error in the envelope, with a code; returns the inner error."""
    if status is not None:
        assert response.status_code == status, (response.status_code, response.content[:500])
    assert 400 <= response.status_code < 500, (response.status_code, response.content[:500])
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    body = orjson.loads(response.content)
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == ERROR_KEYS, error
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    assert isinstance(error["code"], str) and error["code"], f"rejection without a code: {error}"
    if code is not None:
        assert error["code"] == code, error
    return error


def record(custom_id, content="Hello", **body_extra):
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": CHAT,
        "body": {"model": MODEL, "messages": [{"role": "user", "content": content}], **body_extra},
    }


def jsonl(*lines):
    """JSONL bytes from objects (dumped) and bytes (taken as they are)."""
    return b"".join((line if isinstance(line, bytes) else orjson.dumps(line)) + b"\n" for line in lines)


def upload(client, content, filename="input.jsonl"):
    from django.core.files.uploadedfile import SimpleUploadedFile

    file = SimpleUploadedFile(filename, content, content_type="application/jsonl")
    return client.post("/v1/files", {"purpose": "batch", "file": file}, format="multipart")


def create(client, **body):
    body.setdefault("endpoint", CHAT)
    body.setdefault("completion_window", "24h")
    return client.post("/v1/batches", body, format="json")
