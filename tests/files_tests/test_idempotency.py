"""Idempotency-Key on POST /v1/files: the same key, bytes, purpose and filename give the first file again
(nothing more stored); the same key with other bytes is 409 idempotency_key_reused."""

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from files.models import File
from tests.files_tests.conftest import assert_envelope
from tests.helpers import stored_files

LINE = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'


def post(persona, content, key, name="in.jsonl"):
    return persona.client.post(
        "/v1/files",
        {"purpose": "batch", "file": SimpleUploadedFile(name, content)},
        format="multipart",
        HTTP_IDEMPOTENCY_KEY=key,
    )


@pytest.mark.django_db
def test_the_same_upload_with_the_same_key_is_the_first_file(alice, file_storage):
    first, again = post(alice, LINE, "up-1"), post(alice, LINE, "up-1")
    assert first.status_code == again.status_code == 200, again.content
    assert again.json()["id"] == first.json()["id"]
    storage_dir, temp_dir = file_storage
    assert File.objects.count() == 1 and len(stored_files(storage_dir)) == 1
    assert stored_files(temp_dir) == []  # the repeat's temporary file is gone


@pytest.mark.django_db
@pytest.mark.parametrize("other", [{"content": LINE * 2}, {"name": "other.jsonl"}])
def test_the_same_key_with_another_upload_is_409(alice, file_storage, other):
    assert post(alice, LINE, "up-1").status_code == 200
    error = assert_envelope(post(alice, other.get("content", LINE), "up-1", other.get("name", "in.jsonl")), 409)
    assert error["code"] == "idempotency_key_reused"
    assert File.objects.count() == 1
    assert stored_files(file_storage[1]) == []


@pytest.mark.django_db
def test_keys_belong_to_one_organization(alice, bob, file_storage):
    assert post(alice, LINE, "k").json()["id"] != post(bob, LINE, "k").json()["id"]
