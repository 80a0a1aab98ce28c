"""orl files create / list / get / delete / content get against a live server."""

import json

from tests.cli_tests.conftest import chat, write_jsonl


def test_it_uploads_lists_gets_and_deletes_a_file(orl, alice, tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", chat("a"), chat("b"))
    created = orl("--json", "files", "create", path)
    assert created.exit_code == 0, created.output
    file = json.loads(created.stdout)
    assert (file["object"], file["filename"], file["purpose"], file["bytes"]) == (
        "file",
        "in.jsonl",
        "batch",
        path.stat().st_size,
    )

    listed = json.loads(orl("--json", "files", "list").stdout)
    assert [f["id"] for f in listed["data"]] == [file["id"]]
    table = orl("files", "list", "--purpose", "batch")
    assert file["id"] in table.stdout and "in.jsonl" in table.stdout

    got = orl("files", "get", file["id"])
    assert got.exit_code == 0 and file["id"] in got.stdout and f"{path.stat().st_size:,}" in got.stdout
    assert json.loads(orl("--json", "files", "get", file["id"]).stdout) == file

    deleted = orl("files", "delete", file["id"])
    assert deleted.exit_code == 0 and f"Deleted {file['id']}." in deleted.stdout
    assert alice.client.get(f"/v1/files/{file['id']}").status_code == 404
    again = orl("--json", "files", "delete", file["id"])
    assert again.exit_code == 1 and f"No such File object: {file['id']}" in again.stderr


def test_it_streams_content_to_a_path_and_to_stdout(orl, alice, tmp_path):
    # ~3 MB: several download chunks.
    path = write_jsonl(tmp_path / "in.jsonl", *(chat(f"r{i}", "x" * 3000) for i in range(1000)))
    file_id = json.loads(orl("--json", "files", "create", path).stdout)["id"]

    target = tmp_path / "out" / "copy.jsonl"
    target.parent.mkdir()
    saved = orl("files", "content", "get", file_id, "-o", target)
    assert saved.exit_code == 0, saved.output
    assert target.read_bytes() == path.read_bytes()
    assert f"Saved {path.stat().st_size:,} bytes of {file_id} to {target}." in saved.stdout
    assert [p.name for p in target.parent.iterdir()] == ["copy.jsonl"]  # no .part left behind

    piped = orl("files", "content", "get", file_id, "-o", "-")
    assert piped.exit_code == 0
    assert piped.stdout_bytes == path.read_bytes()

    as_json = json.loads(orl("--json", "files", "content", "get", file_id, "-o", target).stdout)
    assert as_json == {"id": file_id, "path": str(target), "bytes": path.stat().st_size}


def test_it_leaves_no_file_when_the_download_is_refused(orl, alice, tmp_path):
    target = tmp_path / "out.jsonl"
    result = orl("files", "content", "get", "file-missing", "-o", target)
    assert result.exit_code == 1
    assert "No such File object: file-missing" in result.stderr and "HTTP 404" in result.stderr
    assert list(tmp_path.glob("out.jsonl*")) == []


def test_it_exits_2_when_the_target_directory_is_missing(orl, alice, tmp_path):
    file_id = json.loads(orl("--json", "files", "create", write_jsonl(tmp_path / "in.jsonl", chat("a"))).stdout)["id"]
    result = orl("files", "content", "get", file_id, "-o", tmp_path / "nowhere" / "out.jsonl")
    assert result.exit_code == 2
    assert "its directory does not exist" in result.stderr
