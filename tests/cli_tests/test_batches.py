"""orl batches create / get / list / cancel against a live server (no worker needed)."""

import json

from batches.models import Batch
from tests.cli_tests.conftest import CHAT, chat, write_jsonl


def _create(orl, path, *extra):
    return orl("--json", "batches", "create", "--input-file", path, "--endpoint", CHAT, *extra)


def _api_batch(alice, batch_id):
    return alice.client.get(f"/v1/batches/{batch_id}").json()


def test_it_uploads_and_creates_with_metadata_and_priority(orl, alice, model, tmp_path):
    path = write_jsonl(tmp_path / "requests.jsonl", chat("a"), chat("b"))
    result = _create(orl, path, "--metadata", "team=ml", "-m", "run=7", "--priority", "expedited")
    assert result.exit_code == 0, result.output
    batch = json.loads(result.stdout)
    assert batch == _api_batch(alice, batch["id"])
    assert batch["metadata"] == {"team": "ml", "run": "7"}
    assert batch["priority"] == "expedited"
    assert batch["request_counts"]["total"] == 2
    file = alice.client.get(f"/v1/files/{batch['input_file_id']}").json()
    assert (file["filename"], file["purpose"], file["bytes"]) == ("requests.jsonl", "batch", path.stat().st_size)


def test_it_shows_rejected_records_with_lines_and_codes(orl, alice, model, tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", chat("a"), "{not json", chat("c", model="nobody/unknown"), chat("d"))
    result = orl("batches", "create", "-f", path, "-e", CHAT)
    assert result.exit_code == 0, result.output
    batch = Batch.objects.get()
    assert batch.public_id in result.stdout and "validating" in result.stdout
    assert "2 rejected record(s)" in result.stdout
    rows = [line for line in result.stdout.splitlines() if "invalid_json_line" in line or "model_not_found" in line]
    assert [row.replace("│", " ").split()[:2] for row in rows] == [["2", "invalid_json_line"], ["3", "model_not_found"]]
    assert "body.model" in rows[1]


def test_it_gets_a_batch_as_a_table_and_as_json(orl, alice, model, tmp_path):
    batch_id = json.loads(_create(orl, write_jsonl(tmp_path / "in.jsonl", chat("a"))).stdout)["id"]
    table = orl("batches", "get", batch_id)
    assert table.exit_code == 0, table.output
    for text in (batch_id, "validating", CHAT, "openrelay/gemma-4-31b", "total 1  completed 0  failed 0"):
        assert text in table.stdout
    as_json = orl("--json", "batches", "get", batch_id)
    assert json.loads(as_json.stdout) == _api_batch(alice, batch_id)


def test_it_lists_one_page_or_all_of_them(orl, alice, model, tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", chat("a"))
    ids = [json.loads(_create(orl, path).stdout)["id"] for _ in range(5)]
    newest_first = ids[::-1]

    page = json.loads(orl("--json", "batches", "list", "--limit", "2").stdout)
    assert [b["id"] for b in page["data"]] == newest_first[:2] and page["has_more"] is True

    after = json.loads(orl("--json", "batches", "list", "--limit", "2", "--after", newest_first[1]).stdout)
    assert [b["id"] for b in after["data"]] == newest_first[2:4]

    everything = json.loads(orl("--json", "batches", "list", "--limit", "2", "--all").stdout)
    assert [b["id"] for b in everything["data"]] == newest_first
    assert (everything["first_id"], everything["last_id"], everything["has_more"]) == (ids[-1], ids[0], False)

    table = orl("batches", "list", "--limit", "2")
    assert newest_first[0] in table.stdout and newest_first[2] not in table.stdout
    assert f"More: orl batches list --after {newest_first[1]}" in table.stdout


def test_it_cancels_a_batch(orl, alice, model, tmp_path):
    batch_id = json.loads(_create(orl, write_jsonl(tmp_path / "in.jsonl", chat("a"))).stdout)["id"]
    result = orl("batches", "cancel", batch_id)
    assert result.exit_code == 0, result.output
    assert "cancelling" in result.stdout
    assert _api_batch(alice, batch_id)["status"] == "cancelling"


def test_it_reports_a_refused_cancel_from_the_envelope(orl, alice, model, tmp_path):
    # Every record rejected: the batch is created failed, and a failed batch can't be cancelled.
    path = write_jsonl(tmp_path / "in.jsonl", chat("a", model="nobody/unknown"))
    batch_id = json.loads(_create(orl, path).stdout)["id"]
    result = orl("batches", "cancel", batch_id)
    assert result.exit_code == 1
    assert "Cannot cancel a batch with status 'failed'." in result.stderr
    assert "HTTP 409  type: invalid_request_error" in result.stderr
    assert result.stdout == ""


def test_it_removes_the_upload_when_the_create_is_refused(orl, alice, model, tmp_path):
    result = orl("batches", "create", "-f", write_jsonl(tmp_path / "in.jsonl", chat("a")), "-e", "/v1/nope")
    assert result.exit_code == 1
    assert "param: endpoint" in result.stderr
    assert alice.client.get("/v1/files").json()["data"] == []


def test_it_shows_the_first_rejections_and_points_at_the_rest(orl, alice, model, tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", chat("ok"), *(chat(f"r{i}", model="nobody/unknown") for i in range(25)))
    result = orl("batches", "create", "-f", path, "-e", CHAT)
    assert result.exit_code == 0, result.output
    batch_id = Batch.objects.get().public_id
    assert "25 rejected record(s)" in result.stdout
    assert result.stdout.count("model_not_found") == 20
    assert f"... and 5 more: orl --json batches get {batch_id}" in result.stdout


def test_it_retries_the_failed_records_of_a_finished_batch(orl, alice, model, tmp_path):
    from batches.engine.runner import run_batch

    path = write_jsonl(tmp_path / "in.jsonl", chat("a"), chat("b", "refused [[status:400]]"), chat("c"))
    batch = json.loads(_create(orl, path).stdout)
    run_batch(Batch.objects.get(public_id=batch["id"]).pk)

    result = orl("batches", "retry", batch["id"])

    assert result.exit_code == 0, result.output
    retry = Batch.objects.exclude(public_id=batch["id"]).get()
    assert f"Retrying 1 record(s) of {batch['id']} as {retry.public_id}." in result.stdout
    assert retry.total_count == 1 and retry.records.get().custom_id == "b"
    again = orl("batches", "retry", retry.public_id)  # not finished yet
    assert again.exit_code == 1 and "batch_not_finished" in again.stderr


def test_it_downloads_the_results_so_far(orl, alice, model, tmp_path):
    from batches.engine.runner import run_batch

    path = write_jsonl(tmp_path / "in.jsonl", chat("a"), chat("b", "refused [[status:400]]"))
    batch = json.loads(_create(orl, path).stdout)
    empty = orl("batches", "results", batch["id"], "-o", "-")
    assert empty.exit_code == 0 and empty.stdout == ""  # nothing finished yet
    run_batch(Batch.objects.get(public_id=batch["id"]).pk)

    saved = orl("batches", "results", batch["id"], "-o", tmp_path / "so_far.jsonl")
    assert saved.exit_code == 0 and "output lines so far" in saved.stdout
    assert [json.loads(line)["custom_id"] for line in (tmp_path / "so_far.jsonl").read_text().splitlines()] == ["a"]
    errors = orl("batches", "results", batch["id"], "--errors", "-o", "-")
    assert [json.loads(line)["custom_id"] for line in errors.stdout.splitlines()] == ["b"]


def test_window_picks_an_offered_window_and_a_bad_one_names_them(orl, alice, model, tmp_path, settings):
    settings.OPENRELAY_COMPLETION_WINDOWS = "1h:0.8,24h:0.5"
    path = write_jsonl(tmp_path / "in.jsonl", chat("a"))
    batch = json.loads(_create(orl, path, "--window", "1h").stdout)
    assert batch["completion_window"] == "1h" and batch["expires_at"] - batch["created_at"] == 3600
    refused = _create(orl, path, "-w", "48h")
    assert refused.exit_code != 0 and "'1h'" in refused.output and "completion_window" in refused.output
    limits = orl("limits")
    assert "window 1h" in limits.stdout and "80%" in limits.stdout
    assert "1h 80%" in orl("models").stdout
