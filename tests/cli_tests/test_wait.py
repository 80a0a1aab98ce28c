"""--wait and `orl batches wait`: a real worker cluster runs the batch against the simulated model."""

import json
import subprocess
import sys
from pathlib import Path

from batches.models import Batch
from openrelay.core.models import Price
from openrelay.lib import children
from tests.cli_tests.conftest import CHAT, chat, write_jsonl
from tests.helpers import wait_for

ORL = Path(sys.executable).parent / "orl"  # the console script `pip install -e .` made


def _content(alice, file_id):
    response = alice.client.get(f"/v1/files/{file_id}/content")
    assert response.status_code == 200
    return b"".join(response.streaming_content)


def test_it_waits_with_progress_and_downloads_both_result_files(orl, alice, model, worker, tmp_path):
    Price.objects.create(model=model, input_per_mtok=2, cached_input_per_mtok=1, output_per_mtok=8)
    path = write_jsonl(tmp_path / "in.jsonl", *(chat(f"r{i}") for i in range(5)), chat("bad", "no [[status:400]]"))
    out = tmp_path / "results"
    result = orl("batches", "create", "-f", path, "-e", CHAT, "--wait", "--download", out, "--poll-interval", "0.2")
    assert result.exit_code == 0, result.output

    batch = alice.client.get(f"/v1/batches/{Batch.objects.get().public_id}").json()
    assert batch["status"] == "completed" and batch["request_counts"] == {"total": 6, "completed": 5, "failed": 1}
    output, errors = out / f"{batch['id']}_output.jsonl", out / f"{batch['id']}_error.jsonl"
    assert output.read_bytes() == _content(alice, batch["output_file_id"])
    assert errors.read_bytes() == _content(alice, batch["error_file_id"])
    assert sorted(json.loads(line)["custom_id"] for line in output.read_text().splitlines()) == [
        f"r{i}" for i in range(5)
    ]
    assert [json.loads(line)["custom_id"] for line in errors.read_text().splitlines()] == ["bad"]

    assert f"Batch {batch['id']} completed: 5 completed, 1 failed of 6." in result.stdout
    assert f"Output file {batch['output_file_id']} saved to {output}" in result.stdout
    cost = f"{batch['openrelay']['cost']['total']} USD"
    progress = result.stderr.splitlines()
    assert any(
        "completed 6/6" in line
        and f"{batch['usage']['total_tokens']:,} tokens" in line
        and cost in line
        and "rec/s" in line
        for line in progress
    ), progress
    shown = orl("batches", "get", batch["id"]).stdout
    assert f"cost         {cost}  (input {batch['openrelay']['cost']['input']}" in shown

    # Waiting on a finished batch returns at once, with the same files.
    again = orl("--json", "batches", "wait", batch["id"], "--download", tmp_path / "again")
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout) == batch
    assert (tmp_path / "again" / output.name).read_bytes() == output.read_bytes()

    # On an interactive terminal the same wait draws rich's live bar instead of log lines.
    live = orl("batches", "wait", batch["id"], env={"TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1"})
    assert live.exit_code == 0, live.output
    assert "\x1b[?25l" in live.stderr  # the bar hides the cursor while it draws
    assert "6/6" in live.stderr and "rec/s" in live.stderr and batch["id"] not in live.stderr


def test_it_exits_3_when_the_batch_it_waits_for_is_cancelled(orl, alice, worker, tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", *(chat(f"r{i}", "slow [[latency:500]]") for i in range(40)))
    batch_id = json.loads(orl("--json", "batches", "create", "-f", path, "-e", CHAT).stdout)["id"]
    # The real console script, in its own process, with only the environment to configure it.
    waiting = children.popen(
        [ORL, "batches", "wait", batch_id, "--poll-interval", "0.2"],
        env=orl.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(
            lambda: Batch.objects.filter(public_id=batch_id, status="in_progress").exists(), 30, "the batch to start"
        )
        assert orl("batches", "cancel", batch_id).exit_code == 0
        stdout, stderr = waiting.communicate(timeout=30)
    finally:
        waiting.kill()
    assert waiting.returncode == 3, stderr
    assert f"Batch {batch_id} ended cancelled." in stderr
    assert f"Batch {batch_id} cancelled:" in stdout
    assert orl.key not in stdout + stderr


def test_it_exits_3_when_every_record_is_rejected(orl, alice, model, tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", chat("a", model="nobody/unknown"), "{broken")
    result = orl("batches", "create", "-f", path, "-e", CHAT, "--wait")
    assert result.exit_code == 3
    assert "ended failed." in result.stderr
    assert "2 rejected record(s)" in result.stdout and "No result files." in result.stdout

    as_json = orl("--json", "batches", "create", "-f", path, "-e", CHAT, "--wait")
    assert as_json.exit_code == 3
    assert json.loads(as_json.stdout)["status"] == "failed"
