"""Files tests store bytes and temporary uploads under tmp_path, never in ./var."""

import pytest

from files.models import File
from tests.helpers import stored_files


@pytest.fixture(autouse=True)
def file_storage(tmp_storage, settings, tmp_path):
    """tmp_storage, plus the upload temp dir in tmp_path; both made; yields (storage dir, temp dir)."""
    storage_dir, temp_dir = tmp_storage, tmp_path / "upload-tmp"
    storage_dir.mkdir()
    temp_dir.mkdir()
    settings.FILE_UPLOAD_TEMP_DIR = str(temp_dir)
    return storage_dir, temp_dir


def assert_nothing_left(file_storage):
    storage_dir, temp_dir = file_storage
    assert stored_files(storage_dir) == []
    assert stored_files(temp_dir) == []
    assert File.objects.count() == 0


def assert_envelope(response, status):
    assert response.status_code == status, response.content[:500]
    assert response["Content-Type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error
