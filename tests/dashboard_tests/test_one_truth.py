"""One truth per screen (issue 40): the failed tile and the failures card read as of one moment,
badges and the retry label that say what they count, the operator's deployment errors, and
metadata set through the new-batch form."""

import re
import threading

import pytest
from asgiref.sync import async_to_sync
from django.db import connection, connections
from django.db.models import F
from django.test import Client

from batches import live, operator, selectors, tallies
from batches.dashboard.display import retry_label
from batches.engine.calls.caller import CallResult
from batches.models import Batch, Engine, RecordStatus
from batches.presenters import batch_object
from openrelay.core.models import Deployment, Model
from tests.dashboard_tests.conftest import (
    add_records,
    chat_line,
    jsonl,
    make_member,
    page_html,
    post_upload,
    session_of,
    socket,
)
from tests.helpers import make_batch

# The sockets of these tests, each on a channel layer of its own (conftest.fresh_layer).
pytestmark = pytest.mark.usefixtures("fresh_layer")


def _fail(batch, n, code="http_500"):
    """As a flush writes them: the records and the batch's counter in one transaction."""
    from django.db import transaction

    with transaction.atomic():
        add_records(batch, RecordStatus.FAILED, code, n)
        Batch.objects.filter(pk=batch.pk).update(failed_count=F("failed_count") + n)


# ---------------------------------------------------------------------------
# The failed tile and the failures card


@pytest.mark.django_db(transaction=True)
def test_the_batch_row_and_its_failures_are_read_as_of_one_moment(alice):
    """A flush that commits between the two reads is seen by neither (it was by the second: 15 vs 16)."""
    batch = make_batch(alice.org, total=40)
    _fail(batch, 15)

    def read_then_a_flush_commits():
        row = Batch.objects.get(pk=batch.pk)

        def flush():
            try:
                _fail(batch, 1)
            finally:
                connections.close_all()

        writer = threading.Thread(target=flush)
        writer.start()
        writer.join()
        return row

    row, failures = selectors.failures_with(read_then_a_flush_commits)
    assert row.failed_count == failures.total == 15
    assert not connection.in_atomic_block
    assert Batch.objects.get(pk=batch.pk).failed_count == 16 == selectors.failures(batch.pk).total  # then both


@pytest.mark.django_db(transaction=True)
def test_a_push_that_moves_the_failed_count_carries_the_card_of_the_same_moment(alice, alice_user):
    batch = make_batch(alice.org, total=40)
    _fail(batch, 5)
    cookie = session_of(alice_user)

    def card_total(message):
        return int(re.search(r'data-failures-total="(\d+)"', message["failures"]).group(1))

    async def test():
        ws = socket(f"/ws/batches/{batch.public_id}", cookie)
        assert (await ws.connect())[0]
        first = await ws.receive_json_from(timeout=5)
        assert first["batch"]["request_counts"]["failed"] == card_total(first) == 5
        # A worker read the batch at 7 failed; by the push 11 have failed: the page gets to 11, and
        # every push on the way shows the card of its own moment (the in-memory layer's poll pushes too).
        await _async(_fail)(batch, 2)
        stale = await _async(live.snapshot)(batch.pk)
        await _async(_fail)(batch, 4)
        await _group_send(live.batch_group(batch.public_id), {"type": live.EVENT_TYPE, **stale})
        card, failed = 5, 5
        while failed < 11:
            message = await ws.receive_json_from(timeout=5)
            failed = message["batch"]["request_counts"]["failed"]
            if "failures" in message:
                card = card_total(message)
                assert message["not_run"] == 0
            assert failed == card
        await ws.disconnect()

    async_to_sync(test)()


def _async(fn):
    from asgiref.sync import sync_to_async

    return sync_to_async(fn)


async def _group_send(group, message):
    from channels.layers import get_channel_layer

    await get_channel_layer().group_send(group, message)


# ---------------------------------------------------------------------------
# Badges and the retry button say what they count


def test_the_retry_label_says_which_records_it_reruns():
    assert retry_label(16, 0) == "Retry 16 failed records"
    assert retry_label(1, 0) == "Retry 1 failed record"
    assert retry_label(0, 120) == "Retry 120 records not run"
    assert retry_label(0, 1) == "Retry 1 record not run"
    assert retry_label(4, 1_200) == "Retry 1,204 records (4 failed, 1,200 not run)"


def _badges(page):
    card = page.split("Failures by code")[1].split("</h2>")[0]
    return {
        kind: (None if "hidden" in attrs else value)
        for kind, attrs, value in re.findall(r'data-badge="(\w+)"([^>]*)><span data-field="\w+">([\d,]+)</span>', card)
    }


def test_a_cancelled_batchs_badges_and_retry_button_count_what_they_say(alice_client, alice):
    batch = make_batch(alice.org, status="cancelled", total=120, failed=120, progress=[[1000.0, 0, 0]])
    add_records(batch, RecordStatus.CANCELLED, "batch_cancelled", 120)
    page = page_html(alice_client.get(f"/batches/{batch.public_id}"))
    stat = dict(re.findall(r'<span class="value" data-field="(failed|not_run)">([^<]+)<', page))
    assert stat == {"failed": "0", "not_run": "120"}
    assert _badges(page) == {"failed": None, "not_run": "120"}  # no "120 failures"
    assert re.search(r'data-field="retry_label">Retry 120 records not run</button>', page)


def test_a_finished_batchs_failed_badge_is_its_failed_tile(alice_client, alice):
    batch = make_batch(alice.org, status="completed", total=40, completed=24, progress=[[1000.0, 24, 0]])
    _fail(batch, 16)
    page = page_html(alice_client.get(f"/batches/{batch.public_id}"))
    assert re.search(r'<span class="value" data-field="failed">16<', page)
    assert _badges(page) == {"failed": "16", "not_run": None}
    assert "Retry 16 failed records" in page


# ---------------------------------------------------------------------------
# The operator page: a record's 400 is not the deployment failing


def _call(deployment, status_code=None, kind="response"):
    tallies.call(deployment.pk, CallResult(kind=kind, status_code=status_code), 0.01)


def test_a_deployment_whose_calls_only_got_400s_is_not_failing(alice, django_user_model):
    model = Model.objects.create(name="openrelay/gemma-4-31b")
    deployment = Deployment.objects.create(model=model, base_url="http://10.0.0.1:8000/v1", max_concurrency=8)
    try:
        for _ in range(270):
            _call(deployment, 200)
        for status in (400, 404, 422, 429) * 7 + (400, 400):
            _call(deployment, status)  # the records' own errors: 30 of the 300 calls
        Engine.objects.create(owner="host:1:a", calls=tallies.take()[1])
        (_, calls), *_ = operator.overview().models[0].deployments
        assert (calls.a_minute, calls.failed_a_minute) == (300, 0)
        assert operator.state(deployment, calls) == "up"

        staff = make_member(django_user_model, "root", alice.org)
        staff.is_staff = True
        staff.save(update_fields=["is_staff"])
        client = Client()
        client.force_login(staff)
        page = page_html(client.get("/operator"))
        row = page.split(f'data-deployment="{deployment.pk}"')[1].split("</tr>")[0]
        assert 'data-field="state"' not in row and 'data-field="error_rate">0.0%<' in row
        # The two "last minute" figures say what they count, so 300 calls beside 0 records can't contradict.
        assert "Records of running batches done, last minute" in page and "a batch that just finished" in page

        # What the deployment itself fails: no answer, 5xx, 401/403, the time limit.
        for status, kind in ((None, "unavailable"), (503, "response"), (401, "response"), (403, "response")):
            _call(deployment, status, kind)
        _call(deployment, kind="time_limit")
        Engine.objects.filter(owner="host:1:a").update(calls=tallies.take()[1])
        (_, calls), *_ = operator.overview().models[0].deployments
        assert (calls.a_minute, calls.failed_a_minute) == (305, 5)
        assert operator.state(deployment, calls) == "failing"
    finally:
        tallies._minute.pop(deployment.pk, None)


# ---------------------------------------------------------------------------
# Metadata through the new-batch form: the API's own check


def _metadata_form(pairs):
    return {"metadata_key": [k for k, _ in pairs], "metadata_value": [v for _, v in pairs]}


def test_the_new_batch_form_sets_metadata_checked_as_the_api_checks_it(alice_client, alice, gemma):
    form = page_html(alice_client.get("/batches/new"))
    assert form.count('name="metadata_key"') == 2 and 'data-max="16"' in form
    content = jsonl(chat_line("a"))
    pairs = [("team", "vision"), ("", ""), ("run", "nightly 7")]
    response = post_upload(alice_client, content, **_metadata_form(pairs))
    assert response.status_code == 302
    batch = Batch.objects.get()
    assert batch_object(batch)["metadata"] == {"team": "vision", "run": "nightly 7"}
    page = page_html(alice_client.get(f"/batches/{batch.public_id}"))
    assert "<tr><th><code>team</code></th><td>vision</td></tr>" in page

    refusals = {
        "too many properties. Expected an object with at most 16": [(f"k{i}", "v") for i in range(17)],
        "is too long. Expected keys of at most 64 characters": [("k" * 65, "v")],
        "Expected a string with maximum length 512": [("note", "x" * 513)],
        "has no key": [("", "orphan")],
        "is given twice": [("team", "a"), ("team", "b")],
    }
    for message, pairs in refusals.items():
        response = post_upload(alice_client, content, **_metadata_form(pairs))
        text = response.content.decode().replace("&#x27;", "'")
        assert response.status_code == 400 and message in text, message
        assert f'value="{pairs[0][1]}"' in text  # what was typed comes back
    assert Batch.objects.count() == 1
