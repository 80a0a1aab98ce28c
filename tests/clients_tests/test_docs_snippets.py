"""The snippets a newcomer pastes reach a finished batch: the README's curl and SDK blocks and every
shell block of docs/tutorial.md, read from the Markdown (so the text under test is the text people
read), run against uvicorn and a real worker cluster."""

import json
import os
import re
import subprocess
import sys

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.django_db(transaction=True)

# What the pages say to paste, and what the test uses instead: the live server's address and a real key.
DOCUMENTED_ORIGIN = "http://127.0.0.1:8000"
KEY_PLACEHOLDER = "or_..."
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", re.S | re.M)


def readme_block(heading, language):
    """The first ```language block under `### heading` in README.md."""
    text = (ROOT / "README.md").read_text()
    section = text.split(f"### {heading}\n", 1)[1]
    return re.search(rf"```{language}\n(.*?)```", section, re.S).group(1)


def tutorial_script(text):
    """The tutorial's shell blocks in page order as one bash script, and its titled Python blocks as files.

    Two shell blocks are not run, each for a reason the test can state: the one that starts the product
    (the test starts its own uvicorn and worker cluster; `up` has tests of its own in core_tests) and
    the SDK's install (the test environment has the SDK).
    """
    script, files, skipped = [], {}, []
    for language, info, body in FENCE.findall(text):
        title = re.search(r'title="([^"]+)"', info)
        if language == "python" and title:
            files[title.group(1)] = body
        elif language == "sh" and ("manage.py up" in body or body.strip() == "pip install -q openai"):
            skipped.append(body.strip())
        elif language == "sh":
            script.append(body)
    return "\n".join(script), files, skipped


def live(text, origin, key):
    return text.replace(DOCUMENTED_ORIGIN, origin).replace(KEY_PLACEHOLDER, key)


def test_every_tutorial_step_runs_and_its_check_passes(uvicorn_server, worker, alice, tmp_path):
    script, files, skipped = tutorial_script((ROOT / "docs" / "tutorial.md").read_text())
    assert len(skipped) == 2, skipped  # a third skipped block would be an untested step
    assert set(files) == {"first_batch.py"}
    for name, body in files.items():
        (tmp_path / name).write_text(body)
    (tmp_path / ".venv").symlink_to(sys.prefix)  # `. .venv/bin/activate` from the checkout: the test's venv

    ran = subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + live(script, uvicorn_server.url, alice.key)],
        cwd=tmp_path,
        env={key: value for key, value in os.environ.items() if not key.startswith(("OPENAI_", "OPENRELAY_API"))},
        capture_output=True,
        text=True,
        timeout=240,
    )

    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert "completed 3 of 3" in ran.stdout  # step 7, the SDK
    outputs = sorted((tmp_path / "results").glob("batch_*_output.jsonl"))
    assert len(outputs) == 2  # step 6's batch and step 8's
    for output in outputs:
        lines = [json.loads(line) for line in output.read_text().splitlines()]
        assert sorted(line["custom_id"] for line in lines) == ["colors", "planets", "primes"]
        assert {line["response"]["status_code"] for line in lines} == {200}


def test_the_readme_curl_and_sdk_blocks_pasted_whole_finish_a_batch(uvicorn_server, worker, alice, tmp_path):
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
    sdk = live(sdk, uvicorn_server.url, alice.key)
    ran = subprocess.run(
        [sys.executable, "-c", sdk], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=os.environ
    )

    assert ran.returncode == 0, ran.stderr
    assert "completed=2" in ran.stdout  # print(batch.request_counts, ...)
    assert '"req-1"' in ran.stdout and '"req-2"' in ran.stdout  # the output file's text
