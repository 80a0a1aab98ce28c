"""The batch page's "Retry failed records" button and "finished so far" downloads."""

import re

import orjson

from batches.engine.runner import run_batch
from batches.models import Batch
from tests.helpers import chat, make_batch


def _retry_shown(page):
    """The retry form is always on the page (the socket shows it when the batch ends); hidden unless it applies."""
    form = re.search(r'<form[^>]*data-role="retry"[^>]*>', page).group(0)
    return " hidden" not in form


def test_a_finished_batch_with_failures_offers_a_retry_that_makes_a_new_batch(alice_client, alice, model):
    batch = make_batch(alice.org, [chat("fine"), chat("bad [[status:400]]")])
    run_batch(batch.pk)
    page = alice_client.get(f"/batches/{batch.public_id}").content.decode()
    assert _retry_shown(page)

    response = alice_client.post(f"/batches/{batch.public_id}/retry", follow=True)

    retry = Batch.objects.exclude(pk=batch.pk).get()
    assert response.redirect_chain[-1][0] == f"/batches/{retry.public_id}"
    assert "Retrying 1 record of" in response.content.decode()
    assert retry.total_count == 1 and retry.records.get().custom_id == "req-2"
    again = alice_client.post(f"/batches/{retry.public_id}/retry", follow=True)  # still validating
    assert "Only a completed, expired or cancelled batch can be retried" in again.content.decode()
    assert Batch.objects.count() == 2


def test_no_retry_button_without_failures_or_before_the_end(alice_client, alice, model):
    batch = make_batch(alice.org, [chat("fine")])
    assert not _retry_shown(alice_client.get(f"/batches/{batch.public_id}").content.decode())
    run_batch(batch.pk)
    assert not _retry_shown(alice_client.get(f"/batches/{batch.public_id}").content.decode())


def test_the_lines_finished_so_far_download_while_it_runs(alice_client, alice, bob, model):
    from batches.models import Record, RecordStatus

    batch = make_batch(alice.org, [chat("one"), chat("bad [[status:400]]"), chat("three")])
    run_batch(batch.pk)
    Batch.objects.filter(pk=batch.pk).update(status="in_progress")  # as if still running...
    Record.objects.filter(batch=batch, line=3).update(status=RecordStatus.RUNNING)  # ...with one record in flight
    page = alice_client.get(f"/batches/{batch.public_id}").content.decode()
    assert 'data-so-far="output"' in page and 'data-so-far="error"' in page

    output = alice_client.get(f"/batches/{batch.public_id}/so_far.jsonl")
    errors = alice_client.get(f"/batches/{batch.public_id}/so_far.jsonl?kind=error")

    lines = b"".join(output.streaming_content).splitlines()
    assert [orjson.loads(line)["custom_id"] for line in lines] == ["req-1"]
    assert [orjson.loads(line)["custom_id"] for line in b"".join(errors.streaming_content).splitlines()] == ["req-2"]
    assert output["Content-Disposition"] == f'attachment; filename="{batch.public_id}_output_so_far.jsonl"'
