"""The official OpenAI SDKs (Python and Node) parse every answer about a paused batch: create with
a cap (extra_body), pause and resume (client.post), retrieve, list, cancel while paused."""

import json
import os
import shutil
import subprocess

import openai
import pytest
from openai.types import Batch as SdkBatch

from batches.models import Batch
from tests.batches_api_tests.helpers import chat_line, jsonl, upload
from tests.helpers import ROOT

NODE_DIR = ROOT / "tests" / "node"
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def gemma(transactional_db):
    from tests.batches_api_tests.conftest import _catalog_model
    from tests.batches_api_tests.helpers import GEMMA

    return _catalog_model(GEMMA)


def _input(alice):
    return upload(alice, jsonl(chat_line("a"), chat_line("b"))).public_id


def test_the_python_sdk_parses_a_paused_batch(sdk, alice, gemma):
    created = sdk.batches.create(
        input_file_id=_input(alice),
        endpoint="/v1/chat/completions",
        completion_window="24h",
        extra_body={"openrelay": {"max_cost": "5"}},
    )
    assert created.model_extra["openrelay"]["max_cost"] == "5.000000000"
    paused = sdk.post(f"/batches/{created.id}/pause", cast_to=SdkBatch)
    assert isinstance(paused, SdkBatch) and paused.status == "validating"
    assert paused.model_extra["openrelay"]["paused"]["reason"] == "requested"
    retrieved = sdk.batches.retrieve(created.id)
    assert retrieved.status == "validating" and retrieved.model_extra["openrelay"]["paused"]["since"] > 0
    assert [b.id for b in sdk.batches.list()] == [created.id]
    resumed = sdk.post(f"/batches/{created.id}/resume", body={"max_cost": 9}, cast_to=SdkBatch)
    assert resumed.model_extra["openrelay"] == {
        **resumed.model_extra["openrelay"],
        "paused": None,
        "max_cost": "9.000000000",
    }
    sdk.post(f"/batches/{created.id}/pause", cast_to=SdkBatch)
    cancelled = sdk.batches.cancel(created.id)
    assert cancelled.status == "cancelling" and cancelled.cancelling_at is not None


def test_the_python_sdk_raises_the_coded_refusals(sdk, alice, gemma):
    created = sdk.batches.create(input_file_id=_input(alice), endpoint="/v1/chat/completions", completion_window="24h")
    Batch.objects.filter(public_id=created.id).update(status="completed")
    with pytest.raises(openai.ConflictError) as refused:
        sdk.post(f"/batches/{created.id}/pause", cast_to=SdkBatch)
    assert refused.value.code == "batch_not_pausable"
    alice.org.monthly_budget = 0
    alice.org.save()
    with pytest.raises(openai.APIStatusError) as over:
        sdk.batches.create(input_file_id=_input(alice), endpoint="/v1/chat/completions", completion_window="24h")
    assert over.value.status_code == 402 and over.value.code == "organization_budget_exceeded"


def test_the_node_sdk_parses_a_paused_batch(live_server, alice, gemma):
    node = shutil.which("node")
    assert node, "node is not on the PATH"
    assert (NODE_DIR / "node_modules" / "openai").is_dir(), "the SDK is missing: npm ci --prefix tests/node"
    env = {**os.environ, "OPENAI_BASE_URL": f"{live_server.url}/v1", "OPENAI_API_KEY": alice.key}
    result = subprocess.run(
        [node, str(NODE_DIR / "pause_flow.mjs"), _input(alice)], env=env, capture_output=True, text=True, timeout=90
    )
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["created"]["openrelay"]["max_cost"] == "5.000000000"
    assert seen["paused"]["openrelay"]["paused"]["reason"] == "requested"
    assert seen["retrieved"]["openrelay"]["paused"] == seen["paused"]["openrelay"]["paused"]
    assert seen["listed"] == [seen["created"]["id"]]
    assert seen["resumed"]["openrelay"]["paused"] is None and seen["resumed"]["openrelay"]["max_cost"] == "9.000000000"
    assert seen["cancelled"]["status"] == "cancelling"
    assert seen["refused"] == {"status": 409, "code": "batch_not_pausable"}
