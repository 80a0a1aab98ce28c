"""The official openai Node SDK (npm `openai`, pinned in tests/node/package-lock.json, run with the
machine's node) against uvicorn and a real worker cluster: README's test command installs it."""

import json
import os
import shutil
import subprocess

import pytest

from tests.clients_tests.conftest import chat_line
from tests.helpers import ROOT

NODE_DIR = ROOT / "tests" / "node"

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def run_node(script, *args, base_url, key):
    node = shutil.which("node")
    assert node, "node is not on the PATH"
    assert (NODE_DIR / "node_modules" / "openai").is_dir(), "the SDK is missing: npm ci --prefix tests/node"
    env = {**os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": key}
    result = subprocess.run(
        [node, str(NODE_DIR / script), *map(str, args)], env=env, capture_output=True, text=True, timeout=90
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_it_streams_an_upload_runs_the_batch_and_downloads_it(live_stack, model, alice, tmp_path):
    # A bad first line and 999 good ones: the upload takes them all, create rejects line 1, the 999 run.
    content = b'{"custom_id": "broken",\n' + b"".join(chat_line(f"r{i}", f"question {i}") for i in range(999))
    requests = tmp_path / "requests.jsonl"
    requests.write_bytes(content)

    seen = run_node("batch_flow.mjs", requests, base_url=f"{live_stack.url}/v1", key=alice.key)

    upload = seen["sent"][0]
    assert (upload["method"], upload["url"], upload["streamed"]) == ("POST", f"{live_stack.url}/v1/files", True)
    assert (seen["file"]["bytes"], seen["file"]["filename"], seen["file"]["purpose"]) == (
        len(content),
        "requests.jsonl",
        "batch",
    )
    assert seen["created"]["errors"]["data"] == [
        {"code": "invalid_json_line", "message": "This line is not parseable as valid JSON.", "param": None, "line": 1}
    ]
    batch = seen["batch"]
    assert batch["status"] == "completed", batch
    assert batch["request_counts"] == {"total": 999, "completed": 999, "failed": 0}
    assert batch["metadata"] == {"client": "node"}
    output = [json.loads(line) for line in seen["output"].splitlines()]
    assert [line["custom_id"] for line in output] == [f"r{i}" for i in range(999)]
    assert output[7]["response"]["status_code"] == 200
    assert "question 7" in output[7]["response"]["body"]["choices"][0]["message"]["content"]
    assert seen["batches"] == [batch["id"]]
    assert seen["files"] == [seen["file"]["id"]]
