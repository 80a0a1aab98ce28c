"""orl batches estimate: create's arguments, a quote as a table or --json, nothing left behind."""

import json

from batches.models import Batch
from files.models import File
from tests.cli_tests.conftest import CHAT, chat, write_jsonl


def test_it_quotes_as_json_and_leaves_nothing_behind(orl, alice, model, tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", chat("a"), chat("b"), "{not json")
    result = orl("--json", "batches", "estimate", "-f", path, "-e", CHAT, "--priority", "expedited")
    assert result.exit_code == 0, result.output

    quote = json.loads(result.stdout)
    assert quote["object"] == "openrelay.batch_estimate"
    assert quote["request_counts"] == {"total": 2, "rejected": 1, "calls": 2} and quote["priority"] == "expedited"
    assert quote["input_tokens"]["method"] == "approximation"
    assert not Batch.objects.exists() and not File.objects.exists()


def test_it_shows_a_table_with_method_and_confidence(orl, alice, model, tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", chat("a"), chat("b", model="nobody/unknown"))
    result = orl("batches", "estimate", "--input-file", path, "--endpoint", CHAT, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for text in ("1 accepted  1 rejected", "(approximation", "confidence", "fits window", "model_not_found"):
        assert text in result.stdout, text


def test_a_refused_input_exits_with_the_apis_error(orl, alice, model, tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", "")
    result = orl("batches", "estimate", "-f", path, "-e", CHAT)
    assert result.exit_code != 0
    assert "empty_file" in result.output or "no requests" in result.output
    assert not File.objects.exists()
