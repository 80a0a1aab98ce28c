"""The real openai SDK against a live server: every Files call a user makes."""

import openai
import pytest

from files import services
from tests.helpers import CHAT_LINE, stored_files


@pytest.fixture
def bob_sdk(live_server, bob):
    return openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=bob.key, max_retries=0)


def test_it_creates_from_a_path_raw_bytes_and_a_tuple(sdk, tmp_path):
    path = tmp_path / "requests.jsonl"
    path.write_bytes(CHAT_LINE * 2)
    from_path = sdk.files.create(file=path, purpose="batch")
    with path.open("rb") as handle:
        from_handle = sdk.files.create(file=handle, purpose="batch")
    from_bytes = sdk.files.create(file=CHAT_LINE, purpose="batch")
    from_tuple = sdk.files.create(file=("named.jsonl", CHAT_LINE, "application/jsonl"), purpose="batch")

    assert (from_path.filename, from_path.bytes) == ("requests.jsonl", len(CHAT_LINE) * 2)
    assert from_handle.filename == "requests.jsonl"
    assert (from_bytes.filename, from_bytes.bytes) == ("upload", len(CHAT_LINE))
    assert from_tuple.filename == "named.jsonl"
    for file in (from_path, from_handle, from_bytes, from_tuple):
        assert file.object == "file"
        assert file.purpose == "batch"
        assert file.status == "processed"
        assert file.status_details is None
        assert file.expires_at == file.created_at + 30 * 24 * 3600
        assert file._request_id.startswith("req_")


def test_it_creates_with_expires_after(sdk):
    file = sdk.files.create(file=CHAT_LINE, purpose="batch", expires_after={"anchor": "created_at", "seconds": 7200})
    assert file.expires_at == file.created_at + 7200
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.files.create(file=CHAT_LINE, purpose="batch", expires_after={"anchor": "created_at", "seconds": 60})
    assert caught.value.param == "expires_after[seconds]"


def test_it_explains_bad_uploads(sdk, settings):
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.files.create(file=CHAT_LINE, purpose="fine-tune")
    assert (caught.value.param, caught.value.code) == ("purpose", "invalid_value")
    assert "'batch'" in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.files.create(file=b"\x89PNG\r\n\x1a\n\x00\x00", purpose="batch")
    assert caught.value.code == "invalid_file_format"
    settings.OPENRELAY_MAX_UPLOAD_BYTES = 100
    with pytest.raises(openai.APIStatusError) as caught:
        sdk.files.create(file=CHAT_LINE, purpose="batch")
    assert caught.value.status_code == 413
    assert caught.value.code == "file_too_large"


def test_it_lists_with_pagination(sdk):
    ids = [sdk.files.create(file=CHAT_LINE, purpose="batch").id for _ in range(5)]

    first = sdk.files.list(limit=2)
    assert [f.id for f in first.data] == ids[::-1][:2]
    assert first.has_more is True
    assert [f.id for f in first.iter_pages().__next__().data] == ids[::-1][:2]
    assert [f.id for f in sdk.files.list(limit=2)] == ids[::-1]  # auto-paging follows `after`
    assert [f.id for f in sdk.files.list(limit=2, order="asc")] == ids
    page = sdk.files.list(limit=2, order="asc", after=ids[1])
    assert [f.id for f in page.data] == ids[2:4]
    assert [f.id for f in sdk.files.list(purpose="batch_output")] == []
    assert len(sdk.files.list(purpose="batch").data) == 5


def test_it_retrieves_downloads_and_deletes(sdk, file_storage):
    created = sdk.files.create(file=("requests.jsonl", CHAT_LINE * 3), purpose="batch")
    assert sdk.files.retrieve(created.id) == created
    content = sdk.files.content(created.id)
    assert content.read() == CHAT_LINE * 3
    assert content.response.headers["content-disposition"] == 'attachment; filename="requests.jsonl"'

    deleted = sdk.files.delete(created.id)
    assert (deleted.id, deleted.object, deleted.deleted) == (created.id, "file", True)
    assert stored_files(file_storage[0]) == []
    with pytest.raises(openai.NotFoundError):
        sdk.files.retrieve(created.id)


def test_it_serves_batch_output_files(sdk, alice):
    output = services.create_file_from_chunks(
        organization=alice.org,
        filename="batch_abc_output.jsonl",
        purpose="batch_output",
        chunks=[b'{"id": "batch_req_1"}\n', b'{"id": "batch_req_2"}\n'],
        expires_at=services.default_expiry("batch_output"),
    )
    assert [f.id for f in sdk.files.list(purpose="batch_output")] == [output.public_id]
    retrieved = sdk.files.retrieve(output.public_id)
    assert (retrieved.purpose, retrieved.bytes, retrieved.filename) == ("batch_output", 44, "batch_abc_output.jsonl")
    assert sdk.files.content(output.public_id).read() == b'{"id": "batch_req_1"}\n{"id": "batch_req_2"}\n'
    assert sdk.files.delete(output.public_id).deleted is True


def test_it_refuses_to_delete_a_pinned_file(sdk, alice):
    created = sdk.files.create(file=CHAT_LINE, purpose="batch")
    file = alice.org.files.get(public_id=created.id)
    services.pin(file)
    with pytest.raises(openai.ConflictError) as caught:
        sdk.files.delete(created.id)
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert "has not finished" in caught.value.message
    assert sdk.files.content(created.id).read() == CHAT_LINE
    services.unpin(file.pk)
    assert sdk.files.delete(created.id).deleted is True


def test_it_keeps_organizations_apart(sdk, bob_sdk):
    bobs = bob_sdk.files.create(file=CHAT_LINE, purpose="batch")
    alices = sdk.files.create(file=CHAT_LINE, purpose="batch")
    for call in (sdk.files.retrieve, sdk.files.content, sdk.files.delete):
        with pytest.raises(openai.NotFoundError) as caught:
            call(bobs.id)
        assert caught.value.body["message"] == f"No such File object: {bobs.id}"
        assert caught.value.param == "id"
    assert [f.id for f in sdk.files.list()] == [alices.id]
    assert [f.id for f in bob_sdk.files.list()] == [bobs.id]
    assert bob_sdk.files.content(bobs.id).read() == CHAT_LINE
