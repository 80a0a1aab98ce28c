"""Workflows end to end: create through the API, run the batch with the engine, read the result files."""

import pytest

from batches.engine.runner import run_batch
from batches.models import Batch
from files.services import open_content
from tests.helpers import MODEL, chat, deploy, read_lines
from tests.workflow_tests.conftest import workflow_body

TOKEN = "Bearer e2e-secret-token-42"


@pytest.fixture(autouse=True)
def _storage_and_loopback(tmp_storage, settings):
    settings.OPENRELAY_ALLOW_PRIVATE_URLS = True  # the callback listens on 127.0.0.1


@pytest.fixture
def model(transactional_db, sim):
    """Overrides the shared `model`: on the session's simulator, max_concurrency 8."""
    return deploy(MODEL, sim.base_url, max_concurrency=8)


def record(custom_id, body):
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def create(persona, *records):
    response = persona.client.post(
        "/v1/batches",
        {"endpoint": "/v1/chat/completions", "completion_window": "24h", "requests": list(records)},
        format="json",
    )
    assert response.status_code == 200, response.content
    return Batch.objects.get(public_id=response.json()["id"])


def test_it_runs_a_workflow_batch_to_its_output_line(alice, model, sim, callback):
    alice.org.workflows_enabled = True
    alice.org.save(update_fields=["workflows_enabled"])

    def script(payload):
        if payload["step"] == 1:
            return {"status": "continue", "requests": [{"id": f"p{i}", "body": chat(f"page {i}")} for i in range(2)]}
        if payload["custom_id"] == "inv-2":
            return {"status": "failed", "error": {"message": "Invoice 2 is void."}}
        return {"status": "completed", "output": {"pages": [r["id"] for r in payload["results"]]}}

    callback.answer(script)
    body = workflow_body(callback.url, authorization=TOKEN, context={"invoice": 1})
    batch = create(alice, record("inv-1", body), record("inv-2", body))
    run_batch(batch.pk)

    batch.refresh_from_db()
    assert batch.status == "completed"
    assert (batch.completed_count, batch.failed_count) == (1, 1)
    [line] = read_lines(batch.output_file)
    assert line["custom_id"] == "inv-1" and line["error"] is None
    assert line["response"]["status_code"] == 200
    out = line["response"]["body"]
    assert {k: out[k] for k in ("object", "status", "output", "steps", "requests")} == {
        "object": "openrelay.workflow",
        "status": "completed",
        "output": {"pages": ["p0", "p1"]},
        "steps": 2,
        "requests": 3,
    }
    [error] = read_lines(batch.error_file)
    assert error["custom_id"] == "inv-2" and error["response"] is None
    assert error["error"] == {"code": "workflow_failed", "message": "Invoice 2 is void."}

    # Both records are billed: every request that succeeded, completed or failed record.
    payloads = callback.payloads
    assert len(payloads) == 4 and all(c.headers["Authorization"] == TOKEN for c in callback.calls)
    final_usage = [p["usage"] for p in payloads if p["step"] == 2]
    assert out["usage"] in final_usage
    assert batch.input_tokens == sum(u["prompt_tokens"] for u in final_usage) > 0
    assert batch.output_tokens == sum(u["completion_tokens"] for u in final_usage) > 0
    usage = alice.client.get(f"/v1/batches/{batch.public_id}").json()["usage"]
    assert usage["input_tokens"] == batch.input_tokens and usage["output_tokens"] == batch.output_tokens
    assert len(sim.bodies("/v1/chat/completions")) == 6
    assert all("openrelay" not in b for b in sim.bodies("/v1/chat/completions"))
    # the authorization never reaches the result files
    for file in (batch.output_file, batch.error_file):
        with open_content(file) as f:
            assert b"e2e-secret" not in f.read()


def test_create_rejects_a_workflow_record_without_workflows_enabled(alice, model, sim, callback):
    batch = create(alice, record("plain", chat("hi")), record("wf", workflow_body(callback.url)))
    assert batch.errors == [
        {
            "code": "workflow_not_enabled",
            "message": "Workflows are not enabled for this organization.",
            "param": "body.openrelay.workflow",
            "line": 2,
        }
    ]
    assert batch.total_count == 1
    run_batch(batch.pk)
    batch.refresh_from_db()
    assert (batch.status, batch.completed_count, batch.failed_count) == ("completed", 1, 0)
    assert callback.payloads == []
