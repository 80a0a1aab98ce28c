"""orl's global options (--json, --api-key, --base-url) before the command, after it, or in between."""

import json

from tests.cli_tests.conftest import CHAT, chat, write_jsonl


def test_it_takes_json_after_the_command(orl, alice, model, tmp_path):
    created = orl("batches", "create", "-f", write_jsonl(tmp_path / "in.jsonl", chat("a")), "-e", CHAT, "--json")
    assert created.exit_code == 0, created.output
    batch_id = json.loads(created.stdout)["id"]
    trailing = orl("batches", "get", batch_id, "--json")
    assert trailing.exit_code == 0, trailing.output
    assert json.loads(trailing.stdout) == alice.client.get(f"/v1/batches/{batch_id}").json()
    between = orl("batches", "--json", "list", "--limit", "1")
    assert [b["id"] for b in json.loads(between.stdout)["data"]] == [batch_id]


def test_it_takes_the_key_and_base_url_after_the_command(orl, alice, base_url):
    listed = orl(
        "files",
        "list",
        "--api-key",
        alice.key,
        "--base-url",
        base_url,
        "--json",
        key=None,
        base_url="http://127.0.0.1:9/v1",
    )
    assert listed.exit_code == 0, listed.output
    assert json.loads(listed.stdout)["data"] == []
    equals = orl(
        "models",
        f"--base-url={base_url}",
        f"--api-key={alice.key}",
        "--json",
        key=None,
        base_url="http://127.0.0.1:9/v1",
    )
    assert equals.exit_code == 0, equals.output
    assert json.loads(equals.stdout)["object"] == "list"


def test_it_leaves_arguments_after_a_double_dash_alone(orl, tmp_path, monkeypatch):
    # `--` ends the options: what follows is an argument, here a file named --json.
    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "--json", chat("a"))
    result = orl("files", "create", "--", "--json")
    assert result.exit_code == 0, result.output
    assert "--json" in result.stdout and not result.stdout.lstrip().startswith("{")


def test_it_says_a_trailing_option_needs_its_value(orl):
    result = orl("batches", "list", "--api-key")
    assert result.exit_code == 2
    assert "'--api-key'" in result.stderr and "needs a value" in result.stderr
