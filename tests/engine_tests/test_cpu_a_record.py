"""The gateway's CPU a record (issue 55 item 4): the statements an engine runs on a clock
whatever its load (the batches' poll, the heartbeat) skip the ORM's queryset construction, and
read and write what they did before.
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from batches.engine import store
from batches.models import Batch, Engine
from tests.helpers import chat, make_batch


def test_the_batches_poll_compiled_once_reads_what_the_queryset_reads(alice, model, transactional_db):
    """store.active_batches runs its statement compiled once a connection (CompiledValues): the
    rows, their types (dates, decimals, JSON) and the `only` filter are the queryset's own."""
    batches = [make_batch(alice.org, [chat(f"q{i}")]) for i in range(3)]
    Batch.objects.filter(pk=batches[0].pk).update(status="in_progress", output_contract={"type": "object"})
    Batch.objects.filter(pk=batches[2].pk).update(status="completed")
    expected = sorted(store._active_batches_query(), key=lambda row: row["pk"])

    for _ in range(2):  # compiled at the first call, reused at the second
        assert sorted(store.active_batches(), key=lambda row: row["pk"]) == expected
    assert [row["pk"] for row in expected] == [batches[0].pk, batches[1].pk]
    assert expected[0]["output_contract"] == {"type": "object"} and expected[0]["created_at"].tzinfo is not None
    assert store.active_batches(only=[batches[1].pk]) == [expected[1]]


def test_a_beat_writes_its_row_drops_the_long_dead_and_reads_the_live_as_the_orm_did(engines):
    mine, other = engines("mine"), engines("other")
    Engine.objects.filter(owner=other.owner).update(calls={"3": [1, 2, 0]})
    now = timezone.now()
    Engine.objects.create(owner="long dead", seen_at=now - timedelta(seconds=1000))
    Engine.objects.create(owner="a lease old", seen_at=now - timedelta(seconds=15))

    live = store.heartbeat(mine.owner, {"7": 5}, host="h", pid=42, lease_s=10, first=False)

    assert live == [(mine.owner, {"7": 5}, {}), (other.owner, {}, {"3": [1, 2, 0]})]
    assert set(Engine.objects.values_list("owner", flat=True)) == {mine.owner, other.owner, "a lease old"}
    assert Engine.objects.filter(owner=mine.owner, host="h", pid=42, seen_at__gte=now).exists()
    with pytest.raises(store.Fenced):
        store.heartbeat("gone", {}, first=False)
