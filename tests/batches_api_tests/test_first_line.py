"""Every line, the first included, is judged at create: an upload through POST /v1/files takes any
UTF-8 text, and create rejects each bad line as a record with its line number."""

import orjson
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from batches.models import Batch, Record
from batches.validation.jsonl import INVALID_JSON
from batches.validation.records import NOT_AN_OBJECT
from tests.batches_api_tests.helpers import chat_line, create

pytestmark = pytest.mark.django_db


def upload_route(persona, content):
    """POST /v1/files, as a client uploads; returns the file id."""
    response = persona.client.post(
        "/v1/files", {"purpose": "batch", "file": SimpleUploadedFile("in.jsonl", content)}, format="multipart"
    )
    assert response.status_code == 200, response.content
    return response.json()["id"]


def test_an_all_bad_file_uploads_and_makes_a_failed_batch_listing_each_line(alice, gemma):
    body = create(alice, input_file_id=upload_route(alice, b"{nope\n[]\n")).json()
    assert body["status"] == "failed"
    assert body["errors"]["data"] == [
        {"code": "invalid_json_line", "message": INVALID_JSON, "param": None, "line": 1},
        {"code": "invalid_json_line", "message": NOT_AN_OBJECT, "param": None, "line": 2},
    ]
    assert body["request_counts"] == {"total": 0, "completed": 0, "failed": 0}


def test_a_bad_first_line_rejects_only_itself(alice, gemma):
    good = b"".join(orjson.dumps(chat_line(f"r{i}")) + b"\n" for i in range(999))
    body = create(alice, input_file_id=upload_route(alice, b'"not a request"\n' + good)).json()
    assert body["status"] not in ("failed", "completed")
    assert [(e["code"], e["line"]) for e in body["errors"]["data"]] == [("invalid_json_line", 1)]
    assert body["request_counts"]["total"] == 999
    batch = Batch.objects.get(public_id=body["id"])
    assert list(Record.objects.filter(batch=batch).order_by("line").values_list("line", flat=True)) == list(
        range(2, 1001)
    )


def test_a_byte_order_mark_is_skipped(alice, gemma):
    body = create(alice, input_file_id=upload_route(alice, b"\xef\xbb\xbf" + orjson.dumps(chat_line("a")))).json()
    assert body["errors"] is None
    assert body["request_counts"]["total"] == 1
