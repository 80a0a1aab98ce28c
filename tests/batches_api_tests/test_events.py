"""Create and cancel are announced live (after commit), without the rejections."""

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from batches import live
from tests.batches_api_tests.helpers import chat_line, create, jsonl, upload


def _listen(group):
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(group, channel)
    return lambda: async_to_sync(layer.receive)(channel)


@pytest.mark.django_db
def test_it_announces_create_and_cancel(alice, gemma, django_capture_on_commit_callbacks, settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    receive = _listen(live.org_group(alice.org.pk))
    file = upload(alice, jsonl(chat_line("a"), {"custom_id": "broken"}))
    with django_capture_on_commit_callbacks(execute=True):
        batch_id = create(alice, input_file_id=file.public_id).json()["id"]
    created = receive()
    assert created["type"] == "batch.updated"
    assert created["batch"]["id"] == batch_id and created["batch"]["status"] == "validating"
    assert created["batch"]["errors"] is None  # the rejection stays on the page, not in every event
    with django_capture_on_commit_callbacks(execute=True):
        assert alice.client.post(f"/v1/batches/{batch_id}/cancel").status_code == 200
    assert receive()["batch"]["status"] == "cancelling"


@pytest.mark.django_db
def test_a_snapshot_is_one_query_that_never_reads_the_rejections(alice, gemma, django_assert_num_queries):
    file = upload(alice, jsonl(chat_line("a"), {"custom_id": "broken"}))
    batch_id = create(alice, input_file_id=file.public_id).json()["id"]
    from batches.models import Batch

    pk = Batch.objects.get(public_id=batch_id).pk
    with django_assert_num_queries(1) as captured:
        event = live.snapshot(pk)
    assert '"errors"' not in captured.captured_queries[0]["sql"]
    assert event["batch"]["id"] == batch_id and event["batch"]["errors"] is None
    assert event["batch"]["request_counts"]["total"] == 1
