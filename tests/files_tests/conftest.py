"""Files tests store bytes and temporary uploads under tmp_path, never in ./var."""

from pathlib import Path

import pytest

from files.models import File

CHAT_LINE = (
    b'{"custom_id": "req-1", "method": "POST", "url": "/v1/chat/completions", '
    b'"body": {"model": "openrelay/gemma-4-31b", "messages": [{"role": "user", "content": "Hi"}]}}\n'
)


@pytest.fixture(autouse=True)
def file_storage(settings, tmp_path):
    """Point default storage and the upload temp dir at tmp_path; yields (storage dir, temp dir)."""
    storage_dir, temp_dir = tmp_path / "files", tmp_path / "upload-tmp"
    storage_dir.mkdir()
    temp_dir.mkdir()
    settings.STORAGES = {
        **settings.STORAGES,
        "default": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(storage_dir)}},
    }
    settings.FILE_UPLOAD_TEMP_DIR = str(temp_dir)
    return storage_dir, temp_dir


def stored_files(directory):
    return sorted(p.relative_to(directory).as_posix() for p in Path(directory).rglob("*") if p.is_file())


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


def streamed_multipart(fields, file_size, *, filename="upload", chunk=1024 * 1024):
    """A hand-made multipart/form-data body for httpx: (headers, generator, total length).

    The file part holds `file_size` bytes of JSONL (a chat line, then padding
    lines), produced `chunk` bytes at a time so the test never holds it whole.
    """
    boundary = "openrelay-test-boundary-7d1f0c2a"
    head = b"".join(
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
        for name, value in fields.items()
    )
    head += (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    tail = f"\r\n--{boundary}--\r\n".encode()
    padding_line = b'{"pad": "' + b"x" * 1012 + b'"}\n'  # 1 KiB
    block = CHAT_LINE + padding_line * (chunk // len(padding_line))
    block = block[:chunk]

    def body():
        yield head
        sent = 0
        while sent < file_size:
            piece = block[: min(chunk, file_size - sent)]
            sent += len(piece)
            yield piece
        yield tail

    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}", "Content-Length": str(len(head) + file_size + len(tail))}
    return headers, body()
