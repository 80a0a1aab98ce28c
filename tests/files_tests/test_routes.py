"""GET /v1/files (list), GET /v1/files/{id}, /content and DELETE, through the Django test client."""

from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import AsyncClient
from django.utils import timezone

from files import services
from files.models import File
from tests.files_tests.conftest import assert_envelope
from tests.helpers import CHAT_LINE, stored_files

pytestmark = pytest.mark.django_db


def _make(persona, n=1, purpose="batch", minutes_ago=10, **kwargs):
    files = []
    base = timezone.now() - timedelta(minutes=minutes_ago)
    for i in range(n):
        file = services.create_file_from_chunks(
            organization=persona.org, filename=f"f{i}.jsonl", purpose=purpose, chunks=[CHAT_LINE], **kwargs
        )
        File.objects.filter(pk=file.pk).update(created_at=base + timedelta(seconds=i))
        files.append(file.public_id)
    return files


def _ids(response):
    assert response.status_code == 200, response.content
    return [f["id"] for f in response.json()["data"]]


class TestList:
    def test_it_lists_newest_first_with_the_full_envelope(self, alice):
        ids = _make(alice, 3)
        body = alice.client.get("/v1/files").json()
        assert body["object"] == "list"
        assert [f["id"] for f in body["data"]] == ids[::-1]
        assert (body["first_id"], body["last_id"], body["has_more"]) == (ids[2], ids[0], False)
        assert set(body["data"][0]) == {
            "id",
            "object",
            "bytes",
            "created_at",
            "expires_at",
            "filename",
            "purpose",
            "status",
            "status_details",
        }

    def test_it_answers_an_empty_list(self, alice):
        assert alice.client.get("/v1/files").json() == {
            "object": "list",
            "data": [],
            "first_id": None,
            "last_id": None,
            "has_more": False,
        }

    def test_it_pages_with_after_in_both_orders(self, alice):
        ids = _make(alice, 5)
        page = alice.client.get("/v1/files", {"limit": 2}).json()
        assert ([f["id"] for f in page["data"]], page["has_more"]) == ([ids[4], ids[3]], True)
        assert _ids(alice.client.get("/v1/files", {"limit": 2, "after": ids[3]})) == [ids[2], ids[1]]
        last = alice.client.get("/v1/files", {"limit": 2, "after": ids[1]}).json()
        assert ([f["id"] for f in last["data"]], last["has_more"]) == ([ids[0]], False)
        assert _ids(alice.client.get("/v1/files", {"order": "asc", "limit": 3})) == ids[:3]
        assert _ids(alice.client.get("/v1/files", {"order": "asc", "after": ids[2]})) == ids[3:]

    def test_it_orders_ties_on_created_at_stably(self, alice):
        ids = _make(alice, 4)
        File.objects.update(created_at=timezone.now())
        seen = []
        after = None
        while True:
            page = alice.client.get("/v1/files", {"limit": 1, **({"after": after} if after else {})}).json()
            seen += [f["id"] for f in page["data"]]
            if not page["has_more"]:
                break
            after = page["last_id"]
        assert sorted(seen) == sorted(ids) and len(seen) == 4

    def test_it_filters_by_purpose(self, alice):
        inputs = _make(alice, 2)
        outputs = _make(alice, 1, purpose="batch_output")
        assert _ids(alice.client.get("/v1/files", {"purpose": "batch"})) == inputs[::-1]
        assert _ids(alice.client.get("/v1/files", {"purpose": "batch_output"})) == outputs
        assert _ids(alice.client.get("/v1/files", {"purpose": "fine-tune"})) == []

    @pytest.mark.parametrize(
        "query, param, status",
        [
            ({"limit": "0"}, "limit", 400),
            ({"limit": "10001"}, "limit", 400),
            ({"limit": "ten"}, "limit", 400),
            ({"order": "newest"}, "order", 400),
            ({"order": ""}, "order", 400),
            ({"after": "file-doesnotexist"}, "after", 404),  # the object the cursor names is not found
        ],
    )
    def test_it_refuses_bad_parameters(self, alice, query, param, status):
        error = assert_envelope(alice.client.get("/v1/files", query), status)
        assert error["param"] == param
        assert error["type"] == ("not_found_error" if status == 404 else "invalid_request_error")

    def test_it_accepts_the_limit_bounds(self, alice):
        _make(alice, 2)
        assert len(_ids(alice.client.get("/v1/files", {"limit": 1}))) == 1
        assert len(_ids(alice.client.get("/v1/files", {"limit": 10000}))) == 2

    def test_it_uses_a_constant_number_of_queries(self, alice, django_assert_num_queries):
        ids = _make(alice, 3)
        alice.client.get("/v1/files")  # reads the key (once per 5 s) and writes its last_used_at (once a minute)
        # One query for the page; `after` adds one for the cursor.
        with django_assert_num_queries(1):
            assert len(_ids(alice.client.get("/v1/files"))) == 3
        _make(alice, 30, minutes_ago=5)
        with django_assert_num_queries(1):
            assert len(_ids(alice.client.get("/v1/files"))) == 33
        with django_assert_num_queries(2):
            assert len(_ids(alice.client.get("/v1/files", {"after": ids[1], "purpose": "batch"}))) == 1


class TestRetrieveContentDelete:
    def test_it_retrieves(self, alice):
        (file_id,) = _make(alice)
        body = alice.client.get(f"/v1/files/{file_id}").json()
        assert (body["id"], body["object"], body["bytes"], body["filename"]) == (
            file_id,
            "file",
            len(CHAT_LINE),
            "f0.jsonl",
        )

    def test_it_streams_content_whatever_the_accept_header(self, alice):
        (file_id,) = _make(alice)
        for accept in ("application/binary", "application/json", "*/*", "text/html"):
            response = alice.client.get(f"/v1/files/{file_id}/content", HTTP_ACCEPT=accept)
            assert response.status_code == 200
            assert response.streaming
            assert b"".join(response.streaming_content) == CHAT_LINE
            assert response["Content-Length"] == str(len(CHAT_LINE))
            assert response["Content-Disposition"] == 'attachment; filename="f0.jsonl"'
            assert response["Content-Type"] == "application/octet-stream"

    def test_it_quotes_unusual_filenames(self, alice):
        file = services.create_file_from_chunks(
            organization=alice.org, filename='données "v2".jsonl', purpose="batch", chunks=[CHAT_LINE]
        )
        response = alice.client.get(f"/v1/files/{file.public_id}/content")
        assert response["Content-Disposition"] == "attachment; filename*=utf-8''donn%C3%A9es%20%22v2%22.jsonl"

    def test_it_answers_errors_on_content_as_json(self, alice):
        error = assert_envelope(alice.client.get("/v1/files/file-nope/content", HTTP_ACCEPT="application/binary"), 404)
        assert error["message"] == "No such File object: file-nope"

    def test_it_deletes_row_and_bytes(self, alice, file_storage, django_capture_on_commit_callbacks):
        (file_id,) = _make(alice)
        assert len(stored_files(file_storage[0])) == 1
        with django_capture_on_commit_callbacks(execute=True):
            response = alice.client.delete(f"/v1/files/{file_id}", content_type="application/json")
        assert response.json() == {"id": file_id, "object": "file", "deleted": True}
        assert not File.objects.exists()
        assert stored_files(file_storage[0]) == []
        assert_envelope(alice.client.delete(f"/v1/files/{file_id}"), 404)

    def test_it_refuses_to_delete_a_pinned_file(self, alice, file_storage):
        (file_id,) = _make(alice)
        file = File.objects.get(public_id=file_id)
        assert services.pin(file) is True
        response = alice.client.delete(f"/v1/files/{file_id}")
        error = assert_envelope(response, 409)
        assert response["x-should-retry"] == "false"
        assert (error["param"], error["code"]) == ("id", "file_in_use")
        assert "batch that has not finished" in error["message"]
        assert File.objects.filter(pk=file.pk).exists()
        assert len(stored_files(file_storage[0])) == 1
        services.unpin(file.pk)
        assert alice.client.delete(f"/v1/files/{file_id}").status_code == 200

    def test_it_serves_batch_output_files_on_every_route(self, alice):
        (file_id,) = _make(alice, purpose="batch_output")
        assert alice.client.get(f"/v1/files/{file_id}").json()["purpose"] == "batch_output"
        assert b"".join(alice.client.get(f"/v1/files/{file_id}/content").streaming_content) == CHAT_LINE
        assert alice.client.delete(f"/v1/files/{file_id}").json()["deleted"] is True

    def test_it_answers_405_for_other_methods(self, alice):
        (file_id,) = _make(alice)
        assert "it serves GET, DELETE" in assert_envelope(alice.client.put(f"/v1/files/{file_id}"), 405)["message"]
        assert "it serves GET." in assert_envelope(alice.client.post(f"/v1/files/{file_id}/content"), 405)["message"]

    def test_it_says_how_to_upload_to_a_put(self, alice):
        # curl -T requests.jsonl $BASE/files sends a PUT.
        error = assert_envelope(alice.client.put("/v1/files", CHAT_LINE, content_type="application/octet-stream"), 405)
        assert error["code"] == "method_not_allowed"
        assert error["message"].startswith("Method PUT is not allowed on /v1/files; it serves GET, POST.")
        assert "multipart POST" in error["message"] and "-F file=@requests.jsonl" in error["message"]

    def test_it_requires_an_api_key(self, client):
        for path in ("/v1/files", "/v1/files/file-x", "/v1/files/file-x/content"):
            assert assert_envelope(client.get(path), 401)["type"] == "authentication_error"


class TestIsolation:
    def test_another_organizations_file_is_404_on_every_route(self, alice, bob, file_storage):
        (bobs,) = _make(bob)
        for response in (
            alice.client.get(f"/v1/files/{bobs}"),
            alice.client.get(f"/v1/files/{bobs}/content", HTTP_ACCEPT="application/binary"),
            alice.client.delete(f"/v1/files/{bobs}"),
        ):
            error = assert_envelope(response, 404)
            assert (error["message"], error["param"], error["type"]) == (
                f"No such File object: {bobs}",
                "id",
                "not_found_error",
            )
        assert _ids(alice.client.get("/v1/files")) == []
        assert assert_envelope(alice.client.get("/v1/files", {"after": bobs}), 404)["param"] == "after"
        assert File.objects.filter(public_id=bobs).exists()
        assert len(stored_files(file_storage[0])) == 1
        assert _ids(bob.client.get("/v1/files")) == [bobs]


class TestAsgi:
    """The routes through Django's ASGI handler, as daphne or uvicorn serve them."""

    def test_it_uploads_and_streams_content_asynchronously(self, alice):
        client, auth = AsyncClient(), {"Authorization": f"Bearer {alice.key}"}
        upload = {"purpose": "batch", "file": SimpleUploadedFile("a.jsonl", CHAT_LINE * 2)}
        created = async_to_sync(client.post)("/v1/files", upload, headers=auth)
        assert created.status_code == 200, created.content
        file_id = created.json()["id"]

        async def download():
            response = await client.get(
                f"/v1/files/{file_id}/content", headers={**auth, "Accept": "application/binary"}
            )
            return response, b"".join([chunk async for chunk in response.streaming_content])

        response, content = async_to_sync(download)()
        assert response.is_async
        assert content == CHAT_LINE * 2
        assert response["Content-Length"] == str(len(CHAT_LINE) * 2)
