"""Expired files answer 404 and the periodic sweep deletes them (row and bytes)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from files import services, tasks
from files.models import File
from tests.files_tests.conftest import assert_envelope
from tests.helpers import CHAT_LINE, stored_files

pytestmark = pytest.mark.django_db


@pytest.fixture
def sweep(django_capture_on_commit_callbacks):
    """Run the sweep; bytes go after the commit, so run those callbacks as a real commit would."""

    def run(task=services.delete_expired_files):
        with django_capture_on_commit_callbacks(execute=True):
            return task()

    return run


def _make(persona, expires_at):
    return services.create_file_from_chunks(
        organization=persona.org, filename="x.jsonl", purpose="batch", chunks=[CHAT_LINE], expires_at=expires_at
    )


def test_an_expired_file_is_404_everywhere(alice):
    expired = _make(alice, timezone.now() - timedelta(seconds=1))
    live = _make(alice, timezone.now() + timedelta(hours=1))
    for response in (
        alice.client.get(f"/v1/files/{expired.public_id}"),
        alice.client.get(f"/v1/files/{expired.public_id}/content"),
        alice.client.delete(f"/v1/files/{expired.public_id}"),
    ):
        assert assert_envelope(response, 404)["message"] == f"No such File object: {expired.public_id}"
    assert [f["id"] for f in alice.client.get("/v1/files").json()["data"]] == [live.public_id]


def test_the_sweep_deletes_expired_rows_and_bytes(alice, bob, file_storage, sweep):
    storage_dir = file_storage[0]
    past = timezone.now() - timedelta(minutes=1)
    expired = [_make(alice, past), _make(bob, past)]
    never = _make(alice, None)
    later = _make(alice, timezone.now() + timedelta(days=1))
    assert len(stored_files(storage_dir)) == 4

    assert sweep(tasks.delete_expired_files) == 2

    assert set(File.objects.values_list("pk", flat=True)) == {never.pk, later.pk}
    assert stored_files(storage_dir) == sorted([never.storage_name, later.storage_name])
    assert not any((storage_dir / f.storage_name).exists() for f in expired)
    assert sweep(tasks.delete_expired_files) == 0


def test_the_sweep_works_in_chunks(alice, monkeypatch, file_storage, sweep):
    monkeypatch.setattr(services, "EXPIRY_SWEEP_CHUNK", 2)
    for _ in range(5):
        _make(alice, timezone.now() - timedelta(seconds=1))
    assert sweep() == 5
    assert not File.objects.exists()
    assert stored_files(file_storage[0]) == []


def test_the_sweep_keeps_a_pinned_file_until_its_batch_lets_go(alice, file_storage, sweep):
    file = _make(alice, timezone.now() - timedelta(seconds=1))
    services.pin(file)
    assert sweep() == 0
    assert services.open_content(file).read() == CHAT_LINE  # a running batch still reads it
    assert_envelope(alice.client.get(f"/v1/files/{file.public_id}"), 404)
    services.unpin(file.pk)
    assert sweep() == 1
    assert stored_files(file_storage[0]) == []


def test_it_removes_upload_temp_files_left_by_a_dead_web_process(settings, tmp_path):
    import os
    import time

    settings.FILE_UPLOAD_TEMP_DIR = str(tmp_path)
    old, fresh = tmp_path / "upload_old.part", tmp_path / "upload_fresh.part"
    old.write_bytes(b"x")
    fresh.write_bytes(b"y")
    an_hour_ago = time.time() - services.STALE_UPLOAD_AGE_S - 1
    os.utime(old, (an_hour_ago, an_hour_ago))
    assert services.delete_stale_upload_temp_files() == 1
    assert not old.exists() and fresh.exists()
