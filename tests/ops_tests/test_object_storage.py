"""Files on object storage (OPENRELAY_STORAGE_URL=s3://...), against moto's standalone S3 server (from PyPI):
two worker clusters with separate data folders, sharing only the database and the bucket, run one batch."""

import boto3
import orjson
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from files import storage
from tests.helpers import MODEL, make_persona, status_of, wait_for
from tests.ops_tests.conftest import BUCKET, CREDENTIALS
from tests.processes import cluster

# 20 ms calls, so the batch lasts long enough for both machines' engines to join whichever
# sees it first (40 instant calls could all go to one engine on a loaded machine).
RECORDS = 200


def keys(url):
    endpoint = url.split("endpoint_url=")[1].split("&")[0]
    listed = boto3.client("s3", endpoint_url=endpoint).list_objects_v2(Bucket=BUCKET)
    return [item["Key"] for item in listed.get("Contents", [])]


def test_it_reads_the_storage_url():
    assert storage.storage_from_url("", "/data/files")["OPTIONS"] == {"location": "/data/files"}
    assert storage.storage_from_url("file:///srv/files", "x")["OPTIONS"] == {"location": "/srv/files"}
    s3 = storage.storage_from_url("s3://bucket/some/prefix?endpoint_url=http://minio:9000&region=eu-west-1", "x")
    assert s3["BACKEND"] == "storages.backends.s3.S3Storage"
    assert s3["OPTIONS"]["bucket_name"] == "bucket" and s3["OPTIONS"]["location"] == "some/prefix"
    assert s3["OPTIONS"]["endpoint_url"] == "http://minio:9000" and s3["OPTIONS"]["region_name"] == "eu-west-1"
    for bad in ("s3://", "ftp://host/x", "s3://bucket?access_key=AKIA"):
        with pytest.raises(ValueError):
            storage.storage_from_url(bad, "x")


def test_ranged_reads_give_every_line_across_range_edges(on_s3):
    from django.core.files.base import ContentFile
    from django.core.files.storage import default_storage

    lines = [orjson.dumps({"n": i, "pad": "x" * (i % 997)}) + b"\n" for i in range(20_000)]
    data = b"".join(lines)
    assert len(data) > 2 * storage.RANGE_BYTES
    name = default_storage.save("ranged/in.jsonl", ContentFile(data))
    reader = storage.open_records(default_storage, name)
    assert isinstance(reader, storage.RangedReader)
    offset = 0
    for line in lines:
        reader.seek(offset)
        assert reader.read(len(line)) == line
        offset += len(line)
    reader.close()


def test_a_batch_with_its_input_on_s3_completes_through_two_clusters_with_separate_data_folders(on_s3, model, tmp_path):
    import psutil

    from batches.models import Batch, Engine

    alice = make_persona("alice-org")
    machines = [tmp_path / "machine-a", tmp_path / "machine-b"]
    env = {"OPENRELAY_STORAGE_URL": on_s3, **CREDENTIALS}
    clusters = []
    body = b"".join(
        orjson.dumps(
            {
                "custom_id": f"req-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": MODEL, "messages": [{"role": "user", "content": f"q {i} [[latency:20]]"}]},
            }
        )
        + b"\n"
        for i in range(RECORDS)
    )
    for folder in machines:
        folder.mkdir()
        clusters.append(cluster(folder, **env))
    # Both machines' engines live before the batch exists, so both take part.
    wait_for(lambda: Engine.objects.count() == 4, 60, "four live engines")
    upload = alice.client.post(
        "/v1/files", {"purpose": "batch", "file": SimpleUploadedFile("in.jsonl", body)}, format="multipart"
    )
    assert upload.status_code == 200, upload.content
    created = alice.client.post(
        "/v1/batches",
        {"input_file_id": upload.json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"},
        format="json",
    )
    assert created.status_code == 200, created.content
    try:
        batch = Batch.objects.get(public_id=created.json()["id"])
        wait_for(lambda: status_of(batch) == "completed", 90, "the batch to complete")
        workers = [{child.pid for child in psutil.Process(c.process.pid).children(recursive=True)} for c in clusters]

        def called_from_both():
            calling = {
                pid
                for pid, calls in Engine.objects.values_list("pid", "calls")
                if any(figures[1] for figures in calls.values())
            }
            return all(calling & machine for machine in workers)

        # Each engine publishes its calls of the last minute with its heartbeat (Engine.calls).
        wait_for(called_from_both, 10, "calls made from both machines")
    finally:
        for started in clusters:
            started.stop()
    batch.refresh_from_db()
    assert batch.completed_count == RECORDS
    output = alice.client.get(f"/v1/files/{batch.output_file.public_id}/content")
    lines = [orjson.loads(line) for line in b"".join(output.streaming_content).splitlines()]
    assert sorted(line["custom_id"] for line in lines) == sorted(f"req-{i}" for i in range(RECORDS))
    stored = keys(on_s3)
    assert batch.input_file.storage_name in [key.removeprefix("files/") for key in stored]
    assert batch.output_file.storage_name in [key.removeprefix("files/") for key in stored]
    for folder in machines:  # nothing of the files on either machine's disk
        assert not list((folder / "files").rglob("*.jsonl")) if (folder / "files").exists() else True
