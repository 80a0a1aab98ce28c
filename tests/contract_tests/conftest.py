"""Output-contract fixtures: batches created through the API and run by an in-process engine.

The catalog `model` (on the test's own simulator), the personas and the helpers are shared:
tests/fixtures/ and tests/helpers.py.
"""

import orjson
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from batches.engine.runner import run_batch
from batches.models import Batch
from tests.helpers import CHAT, MODEL, read_lines

# A schema with the three ways the simulator spoils an answer (wrong type, missing field, cut JSON).
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(autouse=True)
def _storage(tmp_storage):
    """Stored files in tmp_path."""


@pytest.fixture
def sim(fresh_sim):
    """The simulator `model` is deployed on: the test's own."""
    return fresh_sim


def person_format(schema=PERSON):
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}}


def chat_body(text, **extra):
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], **extra}


def line(custom_id, body, url=CHAT):
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def create(persona, lines, *, endpoint=CHAT, expect=200, **create_fields):
    """Upload `lines` and create a batch through the API; returns the answer's JSON."""
    content = b"".join(orjson.dumps(item) + b"\n" for item in lines)
    upload = SimpleUploadedFile("in.jsonl", content, content_type="application/jsonl")
    response = persona.client.post("/v1/files", {"purpose": "batch", "file": upload}, format="multipart")
    assert response.status_code == 200, response.content
    body = {"input_file_id": response.json()["id"], "endpoint": endpoint, "completion_window": "24h", **create_fields}
    response = persona.client.post("/v1/batches", body, format="json")
    assert response.status_code == expect, response.content
    return response.json()


def run(persona, lines, **create_fields):
    """Create and run a batch to its end: (batch, {custom_id: output line}, {custom_id: error line})."""
    answer = create(persona, lines, **create_fields)
    assert answer["errors"] is None, answer["errors"]
    batch = Batch.objects.get(public_id=answer["id"])
    run_batch(batch.pk)
    batch.refresh_from_db()
    assert batch.status == "completed"
    out = {item["custom_id"]: item for item in read_lines(batch.output_file)}
    err = {item["custom_id"]: item for item in read_lines(batch.error_file)}
    return batch, out, err


def content_of(output_line):
    return orjson.loads(output_line["response"]["body"]["choices"][0]["message"]["content"])
