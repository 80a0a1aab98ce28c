"""OPENRELAY_LOG_FORMAT=json: every line one JSON object, batch and record ids where a record was worked, no secret."""

import logging
from pathlib import Path

import orjson
import pytest

from batches.models import Record
from openrelay.core.models import Deployment
from openrelay.lib import logs
from tests.helpers import chat, make_batch, make_persona, status_of, wait_for
from tests.ops_tests.conftest import closed_port

pytestmark = pytest.mark.usefixtures("tmp_storage")  # stored files in tmp_path (tests/fixtures/storage.py)

KEY = "sk-upstream-Secret-0123456789abcdef"
SECRET_KEY = "django-secret-key-for-the-json-log-test-42"


def json_lines(path):
    lines = [line for line in Path(path).read_text().splitlines() if line.strip()]
    return [orjson.loads(line) for line in lines]  # a line that is not JSON fails here


def test_a_clusters_lines_parse_carry_batch_and_record_ids_and_no_secret(model, clusters, tmp_path):
    Deployment.objects.create(
        model=model, base_url=f"http://127.0.0.1:{closed_port()}/v1", upstream_model="m", api_key=KEY, max_concurrency=8
    )
    batch = make_batch(make_persona("alice-org").org, [chat(f"q {i}") for i in range(20)])
    cluster = clusters(OPENRELAY_LOG_FORMAT="json", SECRET_KEY=SECRET_KEY, OPENRELAY_METRICS_TOKEN="metrics-token-99")
    wait_for(lambda: status_of(batch) == "completed", 60, "the batch to complete")
    cluster.terminate()
    lines = json_lines(cluster.log.name)
    assert lines and all({"time", "level", "logger", "message"} <= line.keys() for line in lines)
    about_records = [line for line in lines if "record_id" in line]
    assert about_records, [line["message"] for line in lines]
    ids = {r.public_id for r in Record.objects.filter(batch=batch)}
    for line in about_records:
        assert line["batch_id"] == batch.public_id and line["record_id"] in ids
    text = Path(cluster.log.name).read_text()
    for secret in (KEY, KEY.lower(), SECRET_KEY, "metrics-token-99"):
        assert secret not in text


def test_a_web_processs_lines_are_json_uvicorns_own_too(web):
    # PostgreSQL unreachable: /readyz logs why, and an API call logs the failed request with a traceback.
    process = web(
        DATABASE_URL=f"postgres://openrelay:hunter2-secret@127.0.0.1:{closed_port()}/openrelay",
        REDIS_URL="",
        SECRET_KEY=SECRET_KEY,
        OPENRELAY_LOG_FORMAT="json",
    )
    assert process.get("/readyz").status_code == 503
    process.get("/v1/batches", headers={"Authorization": f"Bearer or_{'b' * 43}"})
    process.stop()
    lines = json_lines(process.log.name)
    loggers = {line["logger"] for line in lines}
    assert {"uvicorn.error", "openrelay.probes", "django.request"} <= loggers, loggers
    text = Path(process.log.name).read_text()
    for secret in ("hunter2-secret", "b" * 43, SECRET_KEY):
        assert secret not in text


def test_the_formatter_masks_credentials_whatever_they_belong_to(settings):
    settings.SECRET_KEY = SECRET_KEY
    formatter = logs.JsonFormatter()
    message = (
        f"sent Authorization: Bearer tok-abcdef123456 to postgres://app:pw-9f8e7d6c@db:5432/x with "
        f"or_{'a' * 43} and {KEY} near {SECRET_KEY.upper()}"
    )
    record = logging.LogRecord("openrelay.engine", logging.WARNING, __file__, 1, "%s", (message,), None)
    token = logs.working_on("batch_abc", 7, 3)
    try:
        line = orjson.loads(formatter.format(record))
    finally:
        logs.done(token)
    assert line["batch_id"] == "batch_abc" and line["record_id"].startswith("batch_req_")
    for leaked in ("tok-abcdef123456", "pw-9f8e7d6c", "a" * 43, KEY, SECRET_KEY.upper()):
        assert leaked not in line["message"], line["message"]
    assert "Bearer [redacted]" in line["message"]


def test_the_development_secret_key_is_no_secret_to_mask(settings):
    from openrelay.lib.env import DEV_SECRET_KEY

    settings.SECRET_KEY = DEV_SECRET_KEY  # what `manage.py up` and a checkout run with
    message = "model openrelay/gemma-4-31b failed under a call (see /srv/openrelay/development.log)"
    record = logging.LogRecord("openrelay.engine", logging.WARNING, __file__, 1, "%s", (message,), None)
    assert orjson.loads(logs.JsonFormatter().format(record))["message"] == message
