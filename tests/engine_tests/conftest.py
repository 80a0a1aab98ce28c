"""Engine fixtures: a real simulated model server, a catalog model on it, batches."""

from datetime import timedelta

import orjson
import pytest
from django.utils import timezone

from batches.models import Batch, Record
from files import services as file_services
from openrelay.models import Deployment, Model
from openrelay.simulator import SimulatorConfig, run_in_thread

MODEL = "openrelay/gemma-4-31b"


@pytest.fixture(autouse=True)
def _storage(settings, tmp_path):
    settings.STORAGES = {**settings.STORAGES, "default": {
        "BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "files")}}}


@pytest.fixture
def sim():
    with run_in_thread(SimulatorConfig(retry_after_s=0.2)) as server:
        yield server


@pytest.fixture
def model(transactional_db, sim):
    model = Model.objects.create(name=MODEL)
    Deployment.objects.create(model=model, base_url=sim.base_url, upstream_model="sim-upstream", max_concurrency=16)
    return model


def chat(content, **extra):
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}


def make_batch(org, bodies, *, endpoint="/v1/chat/completions", window=timedelta(hours=24), model=None):
    """A batch as create leaves it: an input file and records pointing into it."""
    lines = [
        orjson.dumps({"custom_id": f"req-{i}", "method": "POST", "url": endpoint, "body": body}) + b"\n"
        for i, body in enumerate(bodies, start=1)
    ]
    file = file_services.create_file_from_chunks(organization=org, filename="in.jsonl", purpose="batch", chunks=lines)
    file_services.pin(file)
    now = timezone.now()
    batch = Batch.objects.create(
        organization=org, endpoint=endpoint, model_name=MODEL, model=model or Model.objects.get(name=MODEL),
        input_file=file, input_file_public_id=file.public_id, created_at=now, expires_at=now + window,
        total_count=len(lines),
    )
    offset, records = 0, []
    for i, line in enumerate(lines, start=1):
        records.append(Record(batch=batch, line=i, custom_id=f"req-{i}", offset=offset, length=len(line)))
        offset += len(line)
    Record.objects.bulk_create(records)
    return batch


def read_lines(file):
    if file is None:
        return []
    with file_services.open_content(file) as f:
        return [orjson.loads(line) for line in f.read().splitlines()]
