"""POST /v1/files: multipart fields, expiry, size cap, whole-file checks (lines are checked at create)."""

import httpx
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from files.models import File
from files.uploads import BatchInputUploadHandler
from tests.files_tests.conftest import assert_envelope, assert_nothing_left
from tests.helpers import CHAT_LINE, stored_files, streamed_multipart

pytestmark = pytest.mark.django_db


def _upload(persona, content=CHAT_LINE, filename="requests.jsonl", **fields):
    data = {"purpose": "batch", **fields}
    if content is not None:
        data["file"] = SimpleUploadedFile(filename, content, content_type="application/octet-stream")
    return persona.client.post("/v1/files", data, format="multipart")


def test_it_stores_an_upload_with_every_field(alice, file_storage):
    response = _upload(alice, CHAT_LINE * 3)
    assert response.status_code == 200
    body = response.json()
    file = File.objects.get(public_id=body["id"])
    assert body == {
        "id": file.public_id,
        "object": "file",
        "bytes": len(CHAT_LINE) * 3,
        "created_at": int(file.created_at.timestamp()),
        "expires_at": int(file.created_at.timestamp()) + 30 * 24 * 3600,
        "filename": "requests.jsonl",
        "purpose": "batch",
        "status": "processed",
        "status_details": None,
    }
    assert body["id"].startswith("file-")
    storage_dir, temp_dir = file_storage
    assert (storage_dir / file.storage_name).read_bytes() == CHAT_LINE * 3
    assert stored_files(temp_dir) == []


def test_it_accepts_curl_style_expires_after(alice):
    response = _upload(alice, **{"expires_after[anchor]": "created_at", "expires_after[seconds]": "3600"})
    assert response.status_code == 200
    body = response.json()
    assert body["expires_at"] == body["created_at"] + 3600


def test_it_accepts_curl_style_expires_after_over_http(alice, live_server):
    # What `curl -F purpose=batch -F file=@x.jsonl -F expires_after[anchor]=... -F expires_after[seconds]=...` sends.
    files = {"file": ("x.jsonl", CHAT_LINE, "application/jsonl")}
    data = {"purpose": "batch", "expires_after[anchor]": "created_at", "expires_after[seconds]": "2592000"}
    response = httpx.post(
        f"{live_server.url}/v1/files", files=files, data=data, headers={"Authorization": f"Bearer {alice.key}"}
    )
    assert response.status_code == 200, response.text
    assert response.json()["expires_at"] == response.json()["created_at"] + 2592000
    assert response.headers["x-request-id"].startswith("req_")


@pytest.mark.parametrize(
    "fields, param, fragment",
    [
        (
            {"expires_after[anchor]": "last_active_at", "expires_after[seconds]": "3600"},
            "expires_after[anchor]",
            "'created_at'",
        ),
        (
            {"expires_after[anchor]": "created_at", "expires_after[seconds]": "3599"},
            "expires_after[seconds]",
            "between 3600",
        ),
        (
            {"expires_after[anchor]": "created_at", "expires_after[seconds]": "2592001"},
            "expires_after[seconds]",
            "2592000",
        ),
        (
            {"expires_after[anchor]": "created_at", "expires_after[seconds]": "soon"},
            "expires_after[seconds]",
            "integer",
        ),
        ({"expires_after[seconds]": "3600"}, "expires_after[anchor]", "Missing required parameter"),
        ({"expires_after[anchor]": "created_at"}, "expires_after[seconds]", "Missing required parameter"),
    ],
)
def test_it_validates_expires_after(alice, file_storage, fields, param, fragment):
    error = assert_envelope(_upload(alice, **fields), 400)
    assert error["param"] == param
    assert fragment in error["message"]
    assert_nothing_left(file_storage)


@pytest.mark.parametrize("purpose", ["fine-tune", "assistants", "batch_output", "user_data"])
def test_it_accepts_only_the_batch_purpose(alice, file_storage, purpose):
    error = assert_envelope(_upload(alice, purpose=purpose), 400)
    assert error["param"] == "purpose"
    assert error["type"] == "invalid_request_error"
    assert f"'{purpose}'" in error["message"] and "'batch'" in error["message"]
    assert_nothing_left(file_storage)


def test_it_requires_purpose(alice, file_storage):
    response = alice.client.post("/v1/files", {"file": SimpleUploadedFile("x.jsonl", CHAT_LINE)}, format="multipart")
    error = assert_envelope(response, 400)
    assert (error["param"], error["code"]) == ("purpose", "missing_required_parameter")
    assert_nothing_left(file_storage)


def test_it_requires_the_file(alice):
    error = assert_envelope(_upload(alice, content=None), 400)
    assert (error["param"], error["code"]) == ("file", "missing_required_parameter")


def test_it_requires_the_file_as_a_file_part(alice):
    # curl -F file=<x.jsonl sends the content as a text field.
    error = assert_envelope(
        alice.client.post("/v1/files", {"purpose": "batch", "file": "text"}, format="multipart"), 400
    )
    assert error["param"] == "file"
    assert "-F file=@" in error["message"]


def test_it_refuses_unknown_fields(alice, file_storage):
    error = assert_envelope(_upload(alice, **{"expires_after[second]": "3600"}), 400)
    assert error["param"] == "expires_after[second]"
    assert_nothing_left(file_storage)


def test_it_refuses_a_json_body(alice):
    response = alice.client.post("/v1/files", {"purpose": "batch"}, format="json")
    error = assert_envelope(response, 415)
    assert "multipart/form-data" in error["message"]


def test_it_asks_for_the_fields_of_an_empty_body(alice, file_storage):
    # Chunked bodies are counted by the ASGI handler (tests/clients_tests); an empty one has no fields.
    response = alice.client.generic("POST", "/v1/files", b"", content_type="multipart/form-data; boundary=b")
    error = assert_envelope(response, 400)
    assert (error["param"], error["code"]) == ("purpose", "missing_required_parameter")
    assert_nothing_left(file_storage)


def test_it_refuses_malformed_multipart(alice, file_storage):
    response = alice.client.generic(
        "POST", "/v1/files", b"--x--\r\n", content_type="multipart/form-data; boundary=\x01"
    )
    error = assert_envelope(response, 400)
    assert error["code"] == "invalid_multipart"
    assert_nothing_left(file_storage)


def test_it_refuses_a_body_that_ends_inside_the_file(alice, file_storage):
    body = (
        b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="x.jsonl"\r\n\r\n' + CHAT_LINE * 3
    )
    response = alice.client.generic("POST", "/v1/files", body, content_type="multipart/form-data; boundary=b")
    error = assert_envelope(response, 400)
    assert (error["param"], error["code"]) == ("file", "upload_interrupted")
    assert_nothing_left(file_storage)


def test_it_does_not_judge_by_filename_or_content_type(alice):
    for filename in ("upload", "data.txt", "image.png"):
        assert _upload(alice, filename=filename).status_code == 200
    response = alice.client.post(
        "/v1/files",
        {"purpose": "batch", "file": SimpleUploadedFile("upload", CHAT_LINE, content_type="image/png")},
        format="multipart",
    )
    assert response.status_code == 200


@pytest.mark.parametrize(
    "content, code, fragment",
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "invalid_file_format", "binary"),
        ('{"custom_id": "caf\u00e9"}\n'.encode("latin-1"), "invalid_file_format", "not UTF-8"),
        (b"", "empty_file", "empty"),
        (b"\n  \r\n\t\n", "empty_file", "empty"),
        (CHAT_LINE + b'{"custom_id": "\xc3"}\n', "invalid_file_format", "not UTF-8"),
        (CHAT_LINE[:-1] + b"\xe2\x82", "invalid_file_format", "multi-byte"),
        (CHAT_LINE * 2 + b"\x00", "invalid_file_format", f"NUL byte at byte {len(CHAT_LINE) * 2}"),
    ],
    ids=["binary", "latin1", "empty", "blank", "bad-utf8-later", "truncated", "nul"],
)
def test_it_refuses_a_file_that_is_not_utf8_text(alice, file_storage, content, code, fragment):
    error = assert_envelope(_upload(alice, content, filename="upload"), 400)
    assert (error["param"], error["code"]) == ("file", code)
    assert fragment in error["message"]
    assert_nothing_left(file_storage)


def test_it_accepts_lenient_but_valid_jsonl(alice):
    for content in (
        b"\n\n  \n" + CHAT_LINE,  # blank lines first
        CHAT_LINE.replace(b"\n", b"\r\n") * 2,  # CRLF
        CHAT_LINE.rstrip(b"\n"),  # no trailing newline
        '{"custom_id": "caf\u00e9 \u2603 \U0001f600"}\n'.encode(),  # multi-byte UTF-8
        b'{"pad": "' + b"x" * (3 * 1024 * 1024) + b'"}\n',  # a first line over several parser chunks
        b"\xef\xbb\xbf" + CHAT_LINE,  # a byte order mark: create skips it
    ):
        assert _upload(alice, content).status_code == 200, content[:80]


@pytest.mark.parametrize(
    "content",
    [
        b'"just a string"\n' + CHAT_LINE,
        b'[{"custom_id": "a"}]\n',
        b'{"custom_id": "a", \n',
        b"custom_id,method,url\nreq-1,POST,/v1/chat/completions\n",
        b"{nope\n[]\n",
        b"x" * (2 * 1024 * 1024),
    ],
    ids=["string", "array", "broken", "csv", "nope-and-array", "long-non-json"],
)
def test_it_leaves_every_line_to_batch_create(alice, content):
    # Lines, the first included, are records: create rejects each bad one with its line number.
    response = _upload(alice, content)
    assert response.status_code == 200, response.content[:300]
    assert response.json()["bytes"] == len(content)


def test_it_checks_utf8_across_chunks(alice):
    # Three-byte characters over several 1 MB parser chunks: some straddle a chunk edge.
    line = ('{"text": "' + "\u20ac" * 40_000 + '"}\n').encode()
    assert _upload(alice, line * 30).status_code == 200
    error = assert_envelope(_upload(alice, line * 30 + b'{"x": "\xff"}\n'), 400)
    assert f"byte {len(line) * 30 + 7:,}" in error["message"]


def test_the_handler_decodes_characters_split_between_chunks():
    handler = BatchInputUploadHandler(limit=1000)
    handler.new_file("file", "upload", "application/octet-stream", None)
    euro = "\u20ac".encode()
    first = b'{"a": "' + euro[:1]
    for chunk, start in ((first, 0), (euro[1:] + b'"}\n', len(first))):
        assert handler.receive_data_chunk(chunk, start) is None
    upload = handler.file_complete(len(first) + 5)
    assert handler.problem is None
    assert upload.read() == b'{"a": "' + euro + b'"}\n'
    upload.close()


def test_it_accepts_files_larger_than_the_form_data_limit(alice, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    response = _upload(alice, CHAT_LINE * 500)
    assert response.status_code == 200
    assert response.json()["bytes"] == len(CHAT_LINE) * 500


class TestSizeLimit:
    def test_it_accepts_exactly_the_limit_and_refuses_one_byte_more(self, alice, settings, file_storage):
        settings.OPENRELAY_MAX_UPLOAD_BYTES = 2 * len(CHAT_LINE)
        assert _upload(alice, CHAT_LINE * 2).status_code == 200
        File.objects.all().delete()
        for path in file_storage[0].rglob("*.jsonl"):
            path.unlink()
        # Caught by the streaming count: the body's Content-Length is within the slack.
        error = assert_envelope(_upload(alice, CHAT_LINE * 2 + b"\n"), 413)
        assert error["code"] == "file_too_large"
        assert f"{2 * len(CHAT_LINE):,} bytes" in error["message"]
        assert_nothing_left(file_storage)

    def test_it_refuses_an_oversized_content_length_before_parsing(self, alice, settings, file_storage):
        settings.OPENRELAY_MAX_UPLOAD_BYTES = 1000
        error = assert_envelope(_upload(alice, CHAT_LINE * 1000), 413)
        assert error["param"] == "file"
        assert "image compression is almost always the fix" in error["message"]
        assert_nothing_left(file_storage)

    def test_it_refuses_200_mb_plus_one_byte_streamed(self, alice, live_server, file_storage):
        limit = 209_715_200
        headers, body = streamed_multipart({"purpose": "batch"}, limit + 1)
        response = httpx.post(
            f"{live_server.url}/v1/files",
            content=body,
            headers={**headers, "Authorization": f"Bearer {alice.key}"},
            timeout=60,
        )
        assert response.status_code == 413
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert error["code"] == "file_too_large"
        assert "209,715,200 bytes (200 MB)" in error["message"]
        assert "compress images" in error["message"] and "JPEG" in error["message"]
        assert_nothing_left(file_storage)

    def test_it_accepts_200_mb_streamed(self, alice, live_server, file_storage):
        limit = 209_715_200
        headers, body = streamed_multipart({"purpose": "batch"}, limit, filename="big.jsonl")
        response = httpx.post(
            f"{live_server.url}/v1/files",
            content=body,
            headers={**headers, "Authorization": f"Bearer {alice.key}"},
            timeout=60,
        )
        assert response.status_code == 200, response.text
        assert response.json()["bytes"] == limit
        storage_dir, temp_dir = file_storage
        file = File.objects.get()
        assert (storage_dir / file.storage_name).stat().st_size == limit
        assert stored_files(temp_dir) == []
