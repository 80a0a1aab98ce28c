"""orl batches create --output-contract / --max-reasks, and the re-asks row of orl batches get."""

import json

from batches.models import Batch
from tests.cli_tests.conftest import CHAT, chat, write_jsonl


def test_it_creates_a_batch_with_an_output_contract_from_a_schema_file(orl, alice, model, tmp_path):
    schema = {"type": "object", "required": ["label"]}
    (tmp_path / "schema.json").write_text(json.dumps(schema))
    path = write_jsonl(tmp_path / "in.jsonl", chat("a"))
    args = ["--json", "batches", "create", "-f", path, "-e", CHAT, "--output-contract", tmp_path / "schema.json"]
    result = orl(*args, "--max-reasks", "3")
    assert result.exit_code == 0, result.output
    batch = Batch.objects.get(public_id=json.loads(result.stdout)["id"])
    assert batch.output_contract == {"schema": schema, "max_reasks": 3}


def test_a_schema_file_that_is_not_json_uploads_nothing(orl, alice, model, tmp_path):
    (tmp_path / "schema.json").write_text("{nope")
    path = write_jsonl(tmp_path / "in.jsonl", chat("a"))
    result = orl("batches", "create", "-f", path, "-e", CHAT, "--output-contract", tmp_path / "schema.json")
    words = " ".join(result.output.replace("│", " ").split())  # the error box wraps the message
    assert result.exit_code == 2 and "is not a JSON file" in words
    assert alice.client.get("/v1/files").json()["data"] == []


def test_an_invalid_schema_is_the_apis_coded_error(orl, alice, model, tmp_path):
    (tmp_path / "schema.json").write_text(json.dumps({"type": "nope"}))
    path = write_jsonl(tmp_path / "in.jsonl", chat("a"))
    result = orl("batches", "create", "-f", path, "-e", CHAT, "--output-contract", tmp_path / "schema.json")
    assert result.exit_code == 1 and "invalid_output_contract" in result.output
    assert not Batch.objects.exists()


def test_get_shows_the_reasks_row_once_any_reask_ran(orl, alice, model, tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", chat("a"))
    batch_id = json.loads(orl("--json", "batches", "create", "-f", path, "-e", CHAT).stdout)["id"]
    assert "re-asks" not in orl("batches", "get", batch_id).stdout
    Batch.objects.filter(public_id=batch_id).update(reasked_count=4, reasks_count=6, invalid_output_count=1)
    table = orl("batches", "get", batch_id).stdout
    assert "records 4  re-asks 6  invalid output 1" in table
