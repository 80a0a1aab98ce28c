"""A down or hung S3 store: uploads, downloads and creates answer a coded 503 within the storage
timeouts (files.storage), and /readyz names storage (openrelay.web.probes). The store is moto's
standalone server (tests.ops_tests.conftest), a closed port, or a socket that never answers."""

import socket
import threading
import time

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from files import storage
from files.models import File
from openrelay.web import probes
from tests.helpers import free_port, make_persona
from tests.ops_tests.conftest import CREDENTIALS

TIMEOUT_S = 1.0


@pytest.fixture
def silent_store():
    """A server that accepts connections and never answers: a hung store."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held, stop = [], threading.Event()

    def accept():
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join()
    for sock in held:
        sock.close()
    listener.close()


@pytest.fixture
def readyz_fresh(settings):
    settings.OPENRELAY_READYZ_STORAGE_TIMEOUT_S = TIMEOUT_S
    probes._storage_seen.update(at=None, client=None)
    yield
    probes._storage_seen.update(at=None, client=None)


def use_store(settings, monkeypatch, endpoint):
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    url = f"s3://openrelay-files/files?endpoint_url={endpoint}&region=us-east-1&addressing_style=path"
    options = storage.storage_from_url(url, "", connect_timeout_s=TIMEOUT_S, read_timeout_s=TIMEOUT_S, attempts=1)
    settings.STORAGES = {**settings.STORAGES, "default": options}


def _upload(persona):
    body = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'
    return persona.client.post(
        "/v1/files", {"purpose": "batch", "file": SimpleUploadedFile("in.jsonl", body)}, format="multipart"
    )


def _assert_storage_unavailable(response):
    assert response.status_code == 503, response.content
    assert response.json()["error"]["code"] == "storage_unavailable"
    assert response.json()["error"]["type"] == "server_error" and response["Retry-After"] == "5"
    assert "127.0.0.1" not in response.content.decode()  # the store's address stays in the log


@pytest.mark.parametrize("state", ["down", "hung"])
def test_uploads_downloads_and_creates_are_503_in_seconds_when_the_store_is_down_or_hung(
    db, settings, monkeypatch, silent_store, readyz_fresh, client, state
):
    use_store(settings, monkeypatch, f"http://127.0.0.1:{free_port()}" if state == "down" else silent_store)
    alice = make_persona("alice-org")
    stored = File.objects.create(
        organization=alice.org, filename="in.jsonl", purpose="batch", bytes=80, storage_name="x.jsonl"
    )
    started = time.monotonic()
    _assert_storage_unavailable(_upload(alice))
    _assert_storage_unavailable(alice.client.get(f"/v1/files/{stored.public_id}/content"))
    created = alice.client.post(
        "/v1/batches",
        {"input_file_id": stored.public_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"},
        format="json",
    )
    _assert_storage_unavailable(created)
    # One attempt of 1 s each (botocore's defaults held a hung upload past 90 s); generous for a loaded machine.
    assert time.monotonic() - started < 30
    assert not File.objects.exclude(pk=stored.pk).exists()  # the refused upload left no row
    ready = client.get("/readyz")
    assert ready.status_code == 503 and ready.json()["unavailable"] == ["storage"]


@pytest.mark.usefixtures("on_s3")
def test_readyz_sees_a_working_store_and_asks_it_at_most_once_in_its_cache_time(
    db, settings, readyz_fresh, client, monkeypatch
):
    asked = []
    real = probes._head_bucket
    monkeypatch.setattr(probes, "_head_bucket", lambda storage: asked.append(1) or real(storage))
    settings.OPENRELAY_READYZ_STORAGE_CACHE_S = 60
    for _ in range(5):
        assert client.get("/readyz").json() == {"status": "ready"}
    assert len(asked) == 1
    alice = make_persona("alice-org")
    assert _upload(alice).status_code == 200  # the timeouts' config keeps path addressing on a working store


def test_every_s3_call_is_bounded_by_default():
    config = storage.storage_from_url("s3://bucket?addressing_style=path", "")["OPTIONS"]["client_config"]
    assert (config.connect_timeout, config.read_timeout) == (5.0, 30.0)
    assert config.retries == {"total_max_attempts": 2, "mode": "standard"}
    assert config.s3 == {"addressing_style": "path"}
