"""JSON routes through uvicorn as real clients send them: chunked, without a Content-Type, as curl -d
does (form-encoded), with a wrong type, malformed, too large; and 405s that say what the route serves."""

import httpx
import orjson
import pytest

from batches.models import Batch
from tests.clients_tests.conftest import chat_line
from tests.helpers import CHAT
from webhooks.models import WebhookEndpoint

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def api(uvicorn_server, alice):
    with httpx.Client(
        base_url=f"{uvicorn_server.url}/v1", headers={"Authorization": f"Bearer {alice.key}"}, timeout=30
    ) as client:
        yield client


@pytest.fixture
def input_file(api, model):
    uploaded = api.post("/files", data={"purpose": "batch"}, files={"file": ("in.jsonl", chat_line("a") * 1)})
    assert uploaded.status_code == 200, uploaded.text
    return uploaded.json()["id"]


def chunked(payload, piece=7):
    """The JSON text of `payload` as a generator of small pieces: httpx sends it chunked."""
    raw = orjson.dumps(payload)
    return (raw[i : i + piece] for i in range(0, len(raw), piece))


def create_params(file_id):
    return {"input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h", "metadata": {"via": "chunked"}}


def error_of(response, status):
    assert response.status_code == status, response.text[:500]
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_it_reads_a_chunked_batch_create(api, input_file):
    response = api.post(
        "/batches", content=chunked(create_params(input_file)), headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 200, response.text
    assert response.request.headers["Transfer-Encoding"] == "chunked"
    assert "Content-Length" not in response.request.headers
    batch = Batch.objects.get(public_id=response.json()["id"])
    assert (batch.input_file_public_id, batch.metadata, batch.total_count) == (input_file, {"via": "chunked"}, 1)


def test_it_reads_a_chunked_webhook_endpoint_create(api):
    payload = {"name": "results", "url": "http://127.0.0.1:9/hooks", "event_types": ["batch.completed"]}
    response = api.post("/webhook_endpoints", content=chunked(payload), headers={"Content-Type": "application/json"})
    assert response.status_code == 200, response.text
    endpoint = WebhookEndpoint.objects.get(public_id=response.json()["id"])
    assert (endpoint.name, endpoint.url, endpoint.event_types) == ("results", payload["url"], ["batch.completed"])


@pytest.mark.parametrize(
    "content_type",
    ["application/x-www-form-urlencoded", None, "application/json; charset=utf-8"],
    ids=["curl -d", "no type", "json with charset"],
)
def test_it_reads_json_sent_as_curl_does(api, input_file, content_type):
    # `curl -d '{...}'` without -H sends application/x-www-form-urlencoded.
    headers = {"Content-Type": content_type} if content_type else {}
    response = api.post("/batches", content=orjson.dumps(create_params(input_file)), headers=headers)
    assert response.request.headers.get("Content-Type") == content_type
    assert response.status_code == 200, response.text
    assert response.json()["input_file_id"] == input_file


@pytest.mark.parametrize(
    "content_type, body",
    [
        ("text/plain", b'{"endpoint": "/v1/chat/completions"}'),
        ("multipart/form-data; boundary=x", b"--x--\r\n"),
        ("application/x-www-form-urlencoded", b"endpoint=%2Fv1%2Fchat%2Fcompletions&completion_window=24h"),
    ],
)
def test_it_asks_for_json_with_any_other_type(api, content_type, body):
    error = error_of(api.post("/batches", content=body, headers={"Content-Type": content_type}), 415)
    assert (error["type"], error["code"]) == ("invalid_request_error", "unsupported_media_type")
    assert "`Content-Type: application/json`" in error["message"]


def test_it_says_where_malformed_json_broke(api):
    body = b'{"endpoint": "/v1/chat/completions",\n "completion_window": "24h",}'
    error = error_of(api.post("/batches", content=iter([body]), headers={"Content-Type": "application/json"}), 400)
    assert error["code"] == "parse_error"
    assert "trailing comma" in error["message"] and "line 2, column" in error["message"]


def test_it_refuses_a_chunked_json_body_over_10_mb(api):
    pieces = (b'{"metadata": "' if i == 0 else b"x" * (1024 * 1024) for i in range(12))
    error = error_of(api.post("/batches", content=pieces, headers={"Content-Type": "application/json"}), 413)
    assert error["code"] == "request_too_large"
    assert "10,485,760 bytes" in error["message"]


def test_a_put_upload_is_told_to_use_a_multipart_post(api):
    # What `curl -T requests.jsonl $BASE/files` sends.
    response = api.put("/files", content=iter([chat_line("a")]))
    error = error_of(response, 405)
    assert error["code"] == "method_not_allowed"
    assert error["message"].startswith("Method PUT is not allowed on /v1/files; it serves GET, POST.")
    assert "multipart POST" in error["message"]
    assert "POST" in response.headers["Allow"]
