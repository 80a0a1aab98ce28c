"""README's Quickstart blocks, pasted whole, reach a finished batch: the curl block with bash, the
SDK block with Python, against uvicorn and a real worker cluster (the blocks are read from README.md,
so the text a newcomer pastes is the text under test)."""

import json
import os
import re
import subprocess
import sys

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.django_db(transaction=True)


def readme_block(heading, language):
    """The first ```language block under `### heading` in README.md."""
    text = (ROOT / "README.md").read_text()
    section = text.split(f"### {heading}\n", 1)[1]
    return re.search(rf"```{language}\n(.*?)```", section, re.S).group(1)


def test_the_curl_and_sdk_blocks_pasted_whole_finish_a_batch(uvicorn_server, worker, alice, tmp_path):
    base = f"{uvicorn_server.url}/v1"
    curl = readme_block("A batch with curl", "sh")
    # The block's own exports name a placeholder key and the default address; the test's come from the env.
    assert "export KEY=or_..." in curl and "export BASE=http://127.0.0.1:8000/v1" in curl
    script = "set -e\n" + "\n".join(line for line in curl.splitlines() if not line.startswith("export "))

    ran = subprocess.run(
        ["bash", "-c", script],
        cwd=tmp_path,
        env={**os.environ, "KEY": alice.key, "BASE": base},
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines()[-1] == "completed"  # the poll loop waited for the end
    results = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert sorted(line["custom_id"] for line in results) == ["req-1", "req-2"]
    assert {line["response"]["status_code"] for line in results} == {200}

    sdk = readme_block("A batch with the OpenAI SDK", "python")
    assert 'base_url="http://127.0.0.1:8000/v1", api_key="or_..."' in sdk
    sdk = sdk.replace("http://127.0.0.1:8000/v1", base).replace('"or_..."', repr(alice.key))
    ran = subprocess.run(
        [sys.executable, "-c", sdk], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=os.environ
    )

    assert ran.returncode == 0, ran.stderr
    assert "completed=2" in ran.stdout  # print(batch.request_counts, ...)
    assert '"req-1"' in ran.stdout and '"req-2"' in ran.stdout  # the output file's text
