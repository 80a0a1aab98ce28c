"""Secrets never leak: tool executor, MCP and workflow `authorization` values, the
upstream deployment's api_key and the organization's API key are searched for
in everything a person can see, and found nowhere.

Batches carrying them run twice: in this process (logs captured at DEBUG) and
in a real qcluster worker subprocess logging at DEBUG to a file. Then the
search covers the result files, every API answer, the captured and the worker
logs, every admin page of every registered model (as a superuser, list and
change pages), the dashboard pages when installed, and the rows the result
files are built from.

Not searched, by design: the input file's own content (the user's upload,
returned to its owner as uploaded) and Deployment.api_key, the column the
engine reads the upstream key from.
"""

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from aiohttp import web
from django.contrib import admin
from django.urls import NoReverseMatch, reverse

from batches.engine.runner import run_batch
from batches.models import Batch, Record
from openrelay.core.models import Deployment, Model
from openrelay.lib import children
from openrelay.simulator.config import SimulatorConfig
from openrelay.simulator.server import run_in_thread
from tests.fixtures.mcp_servers import SECRET as MCP_TOKEN
from tests.fixtures.tool_executor import ok
from tests.fixtures.workflow_callback import Reply
from tests.helpers import MODEL, database_url, wait_for
from tests.reliability_tests.conftest import jsonl, upload

ROOT = Path(__file__).resolve().parents[2]
TOOL_SECRET = "tool-SECRET-7f3a9c"
MCP_WRONG_SECRET = "mcp-WRONG-SECRET-41d2e8"
WORKFLOW_SECRET = "wf-SECRET-b6e0d1"
UPSTREAM_KEY = "sk-upstream-SECRET-c9a4f2"
TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a contract up.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
}


def _line(custom_id, content, **openrelay):
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}]}
    if "tool_config" in openrelay:
        body["tools"] = [TOOL]
    if openrelay:
        body["openrelay"] = openrelay
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def _lines(executor, callback, mcp):
    tool = {"url": executor.url, "authorization": f"Bearer {TOOL_SECRET}"}
    workflow = {"url": callback.url, "authorization": f"Bearer {WORKFLOW_SECRET}", "timeout_ms": 1500}
    return [
        _line("plain", "Hello there."),
        _line("tool-ok", "Look it up.", tool_config=tool),
        _line("tool-fails", "Look it up again. [[tool_rounds:2]]", tool_config={**tool, "url": executor.url + "/x"}),
        _line(
            "mcp-ok",
            "Ask the MCP server.",
            tool_config={"type": "mcp", "url": mcp.url, "authorization": f"Bearer {MCP_TOKEN}"},
        ),
        _line(
            "mcp-refused",
            "Ask it wrongly.",
            tool_config={"type": "mcp", "url": mcp.url, "authorization": f"Bearer {MCP_WRONG_SECRET}"},
        ),
        _line("wf-ok", "Plan the work.", workflow=workflow),
        _line("wf-echoes", "Plan it and fail.", workflow=workflow),
        _line("wf-hangs", "Plan it slowly.", workflow=workflow),
    ]


def _workflow_script(payload):
    """Completes, fails echoing the secret (a careless callback), or never answers."""
    if payload["custom_id"] == "wf-echoes":
        return {"status": "failed", "error": {"code": "bad", "message": f"token Bearer {WORKFLOW_SECRET} refused"}}
    if payload["custom_id"] == "wf-hangs":
        return Reply(hang=True)
    return {"status": "completed", "output": {"plan": "done"}}


def _executor_answers(executor):
    async def answer(request, payload):
        # The second path fails: 401 with the header it got echoed back (a careless executor).
        if request.path.endswith("/x"):
            return web.json_response({"error": f"bad credentials: {request.headers['Authorization']}"}, status=401)
        return await ok()(request, payload)

    executor.answer(answer)


@pytest.fixture
def stage(alice, settings, transactional_db, executor, callback, auth_server):
    settings.OPENRELAY_ALLOW_PRIVATE_URLS = True  # the servers listen on 127.0.0.1
    settings.OPENRELAY_CALL_TIME_LIMIT_S = 10
    alice.org.workflows_enabled = True
    alice.org.save()
    _executor_answers(executor)
    callback.answer(_workflow_script)
    with run_in_thread(SimulatorConfig()) as sim:
        model = Model.objects.create(name=MODEL)
        Deployment.objects.create(
            model=model, base_url=sim.base_url, upstream_model="sim-upstream", api_key=UPSTREAM_KEY, max_concurrency=8
        )
        yield sim


def _create(alice, lines):
    file_id = upload(alice.client, jsonl(*lines)).json()["id"]
    response = alice.client.post(
        "/v1/batches",
        {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"},
        format="json",
    )
    assert response.status_code == 200, response.content
    return Batch.objects.get(public_id=response.json()["id"])


def _worker(tmp_path, log_path):
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "OPENRELAY_DATA_DIR": str(tmp_path),
        "OPENRELAY_ALLOW_PRIVATE_URLS": "true",
        "OPENRELAY_LOG_LEVEL": "DEBUG",
        "OPENRELAY_Q_WORKERS": "1",
        "OPENRELAY_CALL_TIME_LIMIT_S": "10",
    }
    log = open(log_path, "wb")
    process = children.popen(
        [sys.executable, "manage.py", "qcluster"],
        cwd=ROOT,
        env=env,
        start_new_session=True,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    return process, log


def _pages(client, superuser_client, alice, batches):
    """(where, bytes) for every page a person can open."""
    pages = []
    ids = [b.public_id for b in batches]
    files = [f for b in batches for f in (b.output_file, b.error_file) if f is not None]
    for path in [
        "/v1/batches",
        "/v1/files",
        *[f"/v1/batches/{i}" for i in ids],
        *[f"/v1/files/{f.public_id}" for f in files],
        *[f"/v1/files/{f.public_id}/content" for f in files],
    ]:
        response = alice.client.get(path)
        assert response.status_code == 200, path
        pages.append((path, b"".join(response.streaming_content) if response.streaming else response.content))
    for model in admin.site._registry:
        meta = model._meta
        changelist = f"/admin/{meta.app_label}/{meta.model_name}/"
        response = superuser_client.get(changelist)
        assert response.status_code == 200, changelist
        pages.append((changelist, response.content))
        for pk in model._default_manager.values_list("pk", flat=True)[:30]:
            page = f"{changelist}{pk}/change/"
            response = superuser_client.get(page)
            assert response.status_code in (200, 302), page
            pages.append((page, response.content))
    pages.extend(_dashboard_pages(client, alice, batches, files))
    return pages


def _dashboard_pages(client, alice, batches, files):
    try:
        reverse("dashboard:home")
        from openrelay.core.models import Membership
    except (NoReverseMatch, ImportError):
        return []
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_user("alice-member", password="pw")
    Membership.objects.create(user=user, organization=alice.org)
    client.force_login(user)
    paths = [reverse("dashboard:home"), reverse("dashboard:files")]
    paths += [reverse("dashboard:batch", args=[b.public_id]) for b in batches]
    paths += [reverse("dashboard:file-download", args=[f.public_id]) for f in files]
    pages = []
    for path in paths:
        response = client.get(path)
        assert response.status_code == 200, path
        pages.append((path, b"".join(response.streaming_content) if response.streaming else response.content))
    return pages


def _rows():
    """What the result files are built from, and every batch-level column."""
    rows = list(Record.objects.values_list("custom_id", "response_body", "error_code", "error_message"))
    rows += list(Batch.objects.values())
    return [("database", orjson.dumps(rows, default=str))]


def test_no_secret_reaches_a_file_a_log_a_page_or_an_answer(
    alice, stage, tmp_path, caplog, client, admin_user, executor, callback, auth_server
):
    from django.test import Client

    caplog.set_level(logging.DEBUG)
    secrets = [TOOL_SECRET, MCP_TOKEN, MCP_WRONG_SECRET, WORKFLOW_SECRET, UPSTREAM_KEY, alice.key]
    lines = _lines(executor, callback, auth_server)

    # 1. In this process, logs captured at DEBUG.
    here = _create(alice, lines)
    run_batch(here.pk)
    here.refresh_from_db()

    # 2. In a real worker process, logging at DEBUG to a file.
    log_path = tmp_path / "worker.log"
    process, log = _worker(tmp_path, log_path)
    try:
        there = _create(alice, lines)
        wait_for(
            lambda: Batch.objects.get(pk=there.pk).status == "completed",
            60,
            lambda: f"the worker to finish; its log:\n{log_path.read_text(errors='replace')[-3000:]}",
        )
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
        log.close()
    there.refresh_from_db()

    # The batches did what they carry: the secrets were really sent where they belong.
    for batch in (here, there):
        outcome = {line["custom_id"]: line for line in _result_lines(batch)}
        assert set(outcome) == {line["custom_id"] for line in lines}
        ok = {cid for cid, line in outcome.items() if line["error"] is None and line["response"]["status_code"] == 200}
        assert ok == {"plain", "tool-ok", "mcp-ok", "wf-ok"}, outcome
    assert all(r["headers"]["Authorization"] == f"Bearer {TOOL_SECRET}" for r in executor.received)
    assert {c.headers["Authorization"] for c in callback.calls} == {f"Bearer {WORKFLOW_SECRET}"}
    assert f"Bearer {MCP_TOKEN}" in {s.headers.get("authorization") for s in auth_server.seen}
    assert stage.request_count > 0

    superuser = Client()
    superuser.force_login(admin_user)
    haystacks = _pages(client, superuser, alice, [here, there]) + _rows()
    haystacks.append(("captured logs", caplog.text.encode()))
    worker_log = log_path.read_bytes()
    assert b"DEBUG" in worker_log or len(worker_log) > 0, "the worker wrote no log at all"
    haystacks.append(("worker log", worker_log))

    leaks = [(where, secret) for where, text in haystacks for secret in secrets if secret.encode() in text]
    assert leaks == []


def _result_lines(batch):
    from files.services import open_content

    lines = []
    for file in (batch.output_file, batch.error_file):
        if file is not None:
            with open_content(file) as stream:
                lines += [orjson.loads(line) for line in stream.read().splitlines()]
    return lines
