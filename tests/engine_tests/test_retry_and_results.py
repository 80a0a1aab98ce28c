"""POST /v1/batches/{id}/retry (a new batch of the failed records) and GET /v1/batches/{id}/results (what finished so far)."""

import orjson

from batches.engine.runner import run_batch
from batches.models import Batch, BatchStatus
from files import services as file_services
from tests.helpers import chat, make_batch


def _input_lines(batch):
    with file_services.open_content(batch.input_file) as stream:
        return stream.read().splitlines(keepends=True)


def test_it_reruns_exactly_the_failed_lines_as_they_were(alice, model):
    bodies = [chat("fine"), chat("bad [[status:400]]"), chat("fine too"), chat("broken [[status:500]]")]
    batch = make_batch(alice.org, bodies)
    Batch.objects.filter(pk=batch.pk).update(metadata={"team": "ml"}, priority="expedited")
    run_batch(batch.pk)
    batch.refresh_from_db()
    assert (batch.status, batch.completed_count, batch.failed_count) == ("completed", 2, 2)

    response = alice.client.post(f"/v1/batches/{batch.public_id}/retry")

    assert response.status_code == 200, response.content
    retry = response.json()
    assert retry["id"] != batch.public_id and retry["status"] == "validating"
    assert (retry["endpoint"], retry["metadata"], retry["priority"]) == (batch.endpoint, {"team": "ml"}, "expedited")
    assert retry["request_counts"]["total"] == 2
    new = Batch.objects.get(public_id=retry["id"])
    original_lines = _input_lines(batch)
    assert _input_lines(new) == [original_lines[1], original_lines[3]]  # byte for byte
    assert new.input_file.filename == f"{batch.public_id}_retry.jsonl"
    run_batch(new.pk)
    new.refresh_from_db()
    assert (new.status, new.failed_count) == ("completed", 2)  # the same answers again, from a deterministic server


def test_it_refuses_a_running_batch_one_with_nothing_failed_and_a_lost_input(alice, model):
    batch = make_batch(alice.org, [chat("a")])
    running = alice.client.post(f"/v1/batches/{batch.public_id}/retry")
    assert running.status_code == 409 and running.json()["error"]["code"] == "batch_not_finished"

    run_batch(batch.pk)
    nothing = alice.client.post(f"/v1/batches/{batch.public_id}/retry")
    assert nothing.status_code == 400 and nothing.json()["error"]["code"] == "nothing_to_retry"

    failing = make_batch(alice.org, [chat("no [[status:400]]")])
    run_batch(failing.pk)
    failing.refresh_from_db()
    file_services.delete_file(failing.input_file)
    gone = alice.client.post(f"/v1/batches/{failing.public_id}/retry")
    assert gone.status_code == 400 and gone.json()["error"]["code"] == "input_file_gone"
    assert Batch.objects.count() == 2  # no batch was made by the refusals


def test_a_cancelled_batch_retries_its_cancelled_records(alice, model):
    batch = make_batch(alice.org, [chat(f"q{i}") for i in range(3)])
    assert alice.client.post(f"/v1/batches/{batch.public_id}/cancel").status_code == 200
    run_batch(batch.pk)  # the worker completes the cancellation
    batch.refresh_from_db()
    assert (batch.status, batch.failed_count) == (BatchStatus.CANCELLED, 3)

    retry = alice.client.post(f"/v1/batches/{batch.public_id}/retry").json()

    assert retry["request_counts"]["total"] == 3
    custom_ids = [orjson.loads(line)["custom_id"] for line in _input_lines(Batch.objects.get(public_id=retry["id"]))]
    assert custom_ids == ["req-1", "req-2", "req-3"]


def test_the_openai_sdk_reaches_the_route_as_the_readme_shows(alice, model, live_server):
    import openai

    batch = make_batch(alice.org, [chat("no [[status:422]]")])
    run_batch(batch.pk)
    client = openai.OpenAI(api_key=alice.key, base_url=f"{live_server.url}/v1", max_retries=0)

    retry = client.post(f"/batches/{batch.public_id}/retry", cast_to=openai.types.Batch)

    assert isinstance(retry, openai.types.Batch) and retry.request_counts.total == 1
    assert client.batches.retrieve(retry.id).input_file_id == retry.input_file_id


# --- GET /v1/batches/{id}/results: what has finished so far ------------------


def _so_far(persona, batch, kind=None):
    url = f"/v1/batches/{batch.public_id}/results" + (f"?kind={kind}" if kind else "")
    response = persona.client.get(url)
    assert response.status_code == 200, response.content
    return response, b"".join(response.streaming_content)


def test_results_so_far_are_the_finished_lines_in_order_and_equal_the_final_files(alice, model):
    from batches.models import Record, RecordStatus

    batch = make_batch(alice.org, [chat("one"), chat("no [[status:400]]"), chat("three"), chat("four")])
    run_batch(batch.pk)
    batch.refresh_from_db()
    # Finished: byte for byte the stored files.
    response, output = _so_far(alice, batch)
    with file_services.open_content(batch.output_file) as stored:
        assert output == stored.read()
    assert (response["OpenRelay-Lines"], response["OpenRelay-Batch-Status"]) == ("3", "completed")
    assert response["Content-Disposition"] == f'attachment; filename="{batch.public_id}_output_so_far.jsonl"'
    _, error = _so_far(alice, batch, "error")
    with file_services.open_content(batch.error_file) as stored:
        assert error == stored.read()

    # Mid-run: only the finished records, in line order.
    Record.objects.filter(batch=batch, line__in=(1, 4)).update(status=RecordStatus.RUNNING)
    _, partial = _so_far(alice, batch)
    assert [orjson.loads(line)["custom_id"] for line in partial.splitlines()] == ["req-3"]
    _, partial_errors = _so_far(alice, batch, "error")
    assert [orjson.loads(line)["custom_id"] for line in partial_errors.splitlines()] == ["req-2"]


def test_results_so_far_refusals(alice, bob, model):
    batch = make_batch(alice.org, [chat("a")])
    _, nothing_yet = _so_far(alice, batch)
    assert nothing_yet == b""
    bad = alice.client.get(f"/v1/batches/{batch.public_id}/results?kind=input")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "kind"
    foreign = bob.client.get(f"/v1/batches/{batch.public_id}/results")
    assert foreign.status_code == 404 and foreign.json()["error"]["code"] == "batch_not_found"


def test_results_so_far_of_one_failure_code(alice, model):
    batch = make_batch(
        alice.org, [chat("no [[status:400]]"), chat("fine"), chat("gone [[status:404]]"), chat("no [[status:400]]")]
    )
    run_batch(batch.pk)
    _, http_400 = _so_far(alice, batch, "error&code=http_400")
    assert [orjson.loads(line)["custom_id"] for line in http_400.splitlines()] == ["req-1", "req-4"]
    _, none = _so_far(alice, batch, "error&code=batch_expired")
    assert none == b""
    _, output = _so_far(alice, batch, "output&code=http_400")  # a code narrows error lines only
    assert [orjson.loads(line)["custom_id"] for line in output.splitlines()] == ["req-2"]
