"""Uploads sent with `Transfer-Encoding: chunked` (a generator body, no Content-Length), as streaming
clients and the Node SDK send them, through uvicorn and daphne."""

import httpx
import psutil
import pytest

from files.models import File
from tests.clients_tests.conftest import chat_line
from tests.helpers import stored_files, streamed_multipart

pytestmark = pytest.mark.django_db(transaction=True)

LIMIT = 209_715_200  # OPENRELAY_MAX_UPLOAD_BYTES's default: the servers run with it


def chunked_upload(server, key, file_size, **kwargs):
    headers, body = streamed_multipart({"purpose": "batch"}, file_size, **kwargs)
    del headers["Content-Length"]  # httpx then sends the generator chunked
    return httpx.post(
        f"{server.url}/v1/files", content=body, timeout=120, headers={**headers, "Authorization": f"Bearer {key}"}
    )


def rss(server):
    return psutil.Process(server.process.popen.pid).memory_info().rss


def assert_refused_and_nothing_kept(response, server, stored_before):
    assert response.status_code == 413, response.text[:500]
    error = response.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", "file", "file_too_large")
    assert "209,715,200 bytes (200 MB)" in error["message"]
    assert "compress images" in error["message"] and "JPEG" in error["message"]
    assert stored_files(server.storage) == stored_before
    assert stored_files(server.temp) == []
    assert not File.objects.exists()


def test_it_stores_a_200_mb_chunked_upload(uvicorn_server, alice):
    before = rss(uvicorn_server)
    response = chunked_upload(uvicorn_server, alice.key, LIMIT, filename="big.jsonl")
    assert response.status_code == 200, response.text[:500]
    body = response.json()
    assert (body["bytes"], body["filename"]) == (LIMIT, "big.jsonl")
    file = File.objects.get(public_id=body["id"])
    assert (uvicorn_server.storage / file.storage_name).stat().st_size == LIMIT
    assert stored_files(uvicorn_server.temp) == []
    # The body went to disk as it arrived, never into the server's memory whole.
    assert rss(uvicorn_server) - before < 100 * 1024 * 1024


def test_it_refuses_a_chunked_upload_one_byte_over_200_mb(uvicorn_server, alice):
    stored_before = stored_files(uvicorn_server.storage)
    # Within the multipart slack: the upload handler's count of the file part refuses it.
    response = chunked_upload(uvicorn_server, alice.key, LIMIT + 1)
    assert_refused_and_nothing_kept(response, uvicorn_server, stored_before)


def test_it_drops_a_chunked_body_far_over_200_mb_as_it_arrives(uvicorn_server, alice):
    stored_before = stored_files(uvicorn_server.storage)
    before = rss(uvicorn_server)
    # Past the cap the ASGI handler reads and drops the rest; the client still gets the answer.
    response = chunked_upload(uvicorn_server, alice.key, LIMIT + 8 * 1024 * 1024)
    assert_refused_and_nothing_kept(response, uvicorn_server, stored_before)
    assert rss(uvicorn_server) - before < 100 * 1024 * 1024


def test_it_refuses_a_chunked_json_body_to_the_upload_route(uvicorn_server, alice):
    response = httpx.post(
        f"{uvicorn_server.url}/v1/files",
        content=iter([b'{"purpose": "batch"}']),
        headers={"Authorization": f"Bearer {alice.key}", "Content-Type": "application/json"},
    )
    assert response.status_code == 415
    assert "multipart/form-data" in response.json()["error"]["message"]


def test_daphne_reads_chunked_uploads_and_json_bodies(daphne_server, alice, model):
    # daphne (twisted) de-chunks the body into a temporary file, then hands it
    # to the application whole; the handler counts it the same way.
    auth = {"Authorization": f"Bearer {alice.key}"}
    headers, body = streamed_multipart({"purpose": "batch"}, 0)
    lines = chat_line("a") + chat_line("b")
    body = iter([next(body), lines, *body])
    del headers["Content-Length"]
    uploaded = httpx.post(f"{daphne_server.url}/v1/files", content=body, headers={**headers, **auth})
    assert uploaded.status_code == 200, uploaded.text
    assert uploaded.json()["bytes"] == len(lines)
    create = b'{"input_file_id": "%s", "endpoint": "/v1/chat/completions", "completion_window": "24h"}'
    created = httpx.post(
        f"{daphne_server.url}/v1/batches",
        content=iter([create % uploaded.json()["id"].encode()]),
        headers={**auth, "Content-Type": "application/json"},
    )
    assert created.status_code == 200, created.text
    assert created.json()["request_counts"]["total"] == 2
