"""Reuse fixtures: stored files in tmp_path; batches created through the API."""

import orjson
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from tests.helpers import CHAT


@pytest.fixture(autouse=True)
def _storage(tmp_storage):
    """Stored files in tmp_path."""


def upload(persona, bodies, endpoint=CHAT):
    """Upload the bodies as an input file (custom_ids req-1, req-2, ...); its id."""
    content = b"".join(
        orjson.dumps({"custom_id": f"req-{i}", "method": "POST", "url": endpoint, "body": body}) + b"\n"
        for i, body in enumerate(bodies, start=1)
    )
    upload = SimpleUploadedFile("in.jsonl", content, content_type="application/jsonl")
    response = persona.client.post("/v1/files", {"purpose": "batch", "file": upload}, format="multipart")
    assert response.status_code == 200, response.content
    return response.json()["id"]


def create(persona, bodies, endpoint=CHAT, **openrelay):
    """Create a batch of the bodies through the API, with `openrelay` create options; the answer's JSON."""
    body = {"input_file_id": upload(persona, bodies, endpoint), "endpoint": endpoint, "completion_window": "24h"}
    if openrelay:
        body["openrelay"] = openrelay
    response = persona.client.post("/v1/batches", body, format="json")
    assert response.status_code == 200, response.content
    return response.json()
