"""The dashboard's websockets through the real ASGI stack: session auth, isolation, coalescing, polling."""

import time

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer

from batches import live
from batches.dashboard import consumers
from batches.dashboard.display import live_fields
from batches.models import Batch, RecordStatus
from batches.presenters import batch_object
from tests.dashboard_tests.conftest import add_records, session_of, socket
from tests.helpers import make_batch

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_layer")]
IN_MEMORY = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
# How long a message that must come may take (a deadline, not a measure): 2 s was tight on a
# loaded 2-core machine; a passing test never waits it out.
ARRIVES_S = 10


def run(test):
    async_to_sync(test)()


def snapshot(batch, **counts):
    """The batch's event as a worker sends it, with request_counts changed."""
    batch.refresh_from_db()
    obj = batch_object(batch)
    obj["request_counts"] = {**obj["request_counts"], **counts}
    return {"type": live.EVENT_TYPE, "batch": obj}


def sent(event):
    """The push of a worker's event: its snapshot without the rejections, and the page's values formatted."""
    batch = {**event["batch"], "errors": None}
    return {**event, "batch": batch, "fields": live_fields(batch)}


async def nothing(ws, timeout):
    """Nothing arrives within `timeout` seconds (and if something does, the failure shows it)."""
    if not await ws.receive_nothing(timeout=timeout):
        pytest.fail(f"unexpected message: {await ws.receive_json_from()}")


async def group_send(group, message):
    await get_channel_layer().group_send(group, message)


# ---------------------------------------------------------------------------
# Who may listen


def test_an_anonymous_socket_is_refused(db):
    async def test():
        for path in ("/ws/batches", "/ws/batches/batch_whatever"):
            connected, code = await socket(path).connect()
            assert (connected, code) == (False, consumers.NOT_SIGNED_IN)

    run(test)


def test_a_user_without_an_organization_is_refused(django_user_model):
    user = django_user_model.objects.create_user("drifter", password="x")

    cookie = session_of(user)

    async def test():
        connected, code = await socket("/ws/batches", cookie).connect()
        assert (connected, code) == (False, consumers.NO_ORGANIZATION)

    run(test)


def test_a_foreign_or_unknown_batch_feed_is_refused(alice_user, bob):
    theirs = make_batch(bob.org)

    cookie = session_of(alice_user)

    async def test():
        for batch_id in (theirs.public_id, "batch_unknown"):
            connected, code = await socket(f"/ws/batches/{batch_id}", cookie).connect()
            assert (connected, code) == (False, consumers.NOT_FOUND)

    run(test)


# ---------------------------------------------------------------------------
# What reaches whom


def test_a_member_gets_the_organizations_events_and_never_anothers(alice, alice_user, bob):
    mine, theirs = make_batch(alice.org, total=10), make_batch(bob.org, total=10)
    first, pushed = snapshot(mine), snapshot(mine, completed=4)
    foreign = snapshot(theirs, completed=7)

    cookie = session_of(alice_user)

    async def test():
        ws = socket("/ws/batches", cookie)
        assert (await ws.connect())[0]
        # On connect: the unfinished batches as they stand (only alice's).
        assert await ws.receive_json_from(timeout=ARRIVES_S) == sent(first)
        await group_send(live.org_group(bob.org.pk), foreign)
        await group_send(live.batch_group(theirs.public_id), foreign)
        # Long enough for a poll of the in-memory fallback too: bob's batch is unfinished in the database.
        await nothing(ws, consumers.POLL_INTERVAL_S + 0.3)
        await group_send(live.org_group(alice.org.pk), pushed)
        message = await ws.receive_json_from(timeout=ARRIVES_S)
        assert message == sent(pushed)
        # Formatted by the server, as the page renders them: the browser writes them as given.
        assert (message["fields"]["counts"], message["fields"]["percent"], message["fields"]["bar"]) == (
            "4 / 10",
            "40%",
            "40.00%",
        )
        await ws.disconnect()

    run(test)


def test_a_batch_feed_gets_its_batch_and_nothing_else(alice, alice_user):
    rejected = [
        {"code": "invalid_json_line", "message": "This line is not parseable as valid JSON.", "param": None, "line": n}
        for n in range(1, 1001)
    ]
    batch, other = make_batch(alice.org, errors=rejected), make_batch(alice.org)
    pushed, elsewhere = snapshot(batch, completed=2), snapshot(other, completed=1)
    assert len(pushed["batch"]["errors"]["data"]) == 1000

    cookie = session_of(alice_user)

    async def test():
        ws = socket(f"/ws/batches/{batch.public_id}", cookie)
        assert (await ws.connect())[0]
        assert (await ws.receive_json_from(timeout=ARRIVES_S))["batch"]["id"] == batch.public_id
        await group_send(live.batch_group(other.public_id), elsewhere)
        await nothing(ws, 0.3)
        await group_send(live.batch_group(batch.public_id), pushed)
        # The rejections stay on the page; the pushes leave them out.
        assert await ws.receive_json_from(timeout=ARRIVES_S) == sent(pushed)
        await ws.disconnect()

    run(test)


# ---------------------------------------------------------------------------
# Coalescing


def test_a_burst_of_events_goes_out_as_the_newest_one(alice, alice_user):
    batch = make_batch(alice.org, total=100)
    burst = [snapshot(batch, completed=n) for n in range(1, 11)]

    cookie = session_of(alice_user)

    async def test():
        ws = socket(f"/ws/batches/{batch.public_id}", cookie)
        assert (await ws.connect())[0]
        await ws.receive_json_from(timeout=ARRIVES_S)
        for event in burst:
            await group_send(live.batch_group(batch.public_id), event)
        # Ten events inside one interval: one message, the newest.
        assert await ws.receive_json_from(timeout=ARRIVES_S) == sent(burst[-1])
        await nothing(ws, consumers.MIN_INTERVAL_S + 0.2)
        await ws.disconnect()

    run(test)


def test_an_older_snapshot_arriving_late_is_dropped(alice, alice_user):
    batch = make_batch(alice.org, total=10)
    finished = snapshot(batch, completed=10)
    finished["batch"]["status"] = "completed"
    late = snapshot(batch, completed=9)  # read by another worker before the close

    cookie = session_of(alice_user)

    async def test():
        ws = socket(f"/ws/batches/{batch.public_id}", cookie)
        assert (await ws.connect())[0]
        await ws.receive_json_from(timeout=ARRIVES_S)
        await group_send(live.batch_group(batch.public_id), finished)
        assert await ws.receive_json_from(timeout=ARRIVES_S) == sent(finished)
        await group_send(live.batch_group(batch.public_id), late)
        await nothing(ws, consumers.MIN_INTERVAL_S + 0.2)
        await ws.disconnect()

    run(test)


# ---------------------------------------------------------------------------
# The in-memory layer: workers' events can't reach the web process, so it polls


def _set_counts(batch, **fields):
    return sync_to_async(Batch.objects.filter(pk=batch.pk).update)(**fields)


def test_in_memory_the_socket_polls_and_pushes_only_changes_at_most_twice_a_second(alice, alice_user, settings):
    settings.CHANNEL_LAYERS = IN_MEMORY
    batch = make_batch(alice.org, total=1000)

    cookie = session_of(alice_user)

    async def test():
        ws = socket(f"/ws/batches/{batch.public_id}", cookie)
        assert (await ws.connect())[0]
        assert (await ws.receive_json_from(timeout=ARRIVES_S))["batch"]["request_counts"]["completed"] == 0
        # Nothing changes: nothing is sent, however many polls pass.
        await nothing(ws, 2 * consumers.POLL_INTERVAL_S + 0.1)
        # A worker (another process) writes progress every ~60 ms for ~1.5 s.
        received, started = [], time.monotonic()
        for step in range(1, 25):
            await _set_counts(batch, completed_count=step * 10)
            while not await ws.receive_nothing(timeout=0.05, interval=0.01):
                received.append((time.monotonic(), await ws.receive_json_from()))
        elapsed = time.monotonic() - started
        while not await ws.receive_nothing(timeout=consumers.POLL_INTERVAL_S + 0.3):
            received.append((time.monotonic(), await ws.receive_json_from()))
        assert 2 <= len(received) <= 2 * elapsed + 2
        gaps = [b[0] - a[0] for a, b in zip(received, received[1:])]
        # Receipt times carry the test's own scheduling noise, hence the slack.
        assert all(gap >= consumers.MIN_INTERVAL_S - 0.2 for gap in gaps), gaps
        counts = [msg["batch"]["request_counts"]["completed"] for _, msg in received]
        assert counts == sorted(set(counts)) and counts[-1] == 240
        # The terminal snapshot goes out, then the socket stops polling.
        await _set_counts(batch, status="completed", completed_count=1000)
        assert (await ws.receive_json_from(timeout=ARRIVES_S))["batch"]["status"] == "completed"
        await _set_counts(batch, metadata={"changed": "after the end"})
        await nothing(ws, 2 * consumers.POLL_INTERVAL_S + 0.1)
        await ws.disconnect()

    run(test)


def test_in_memory_the_organization_feed_picks_up_new_and_finishing_batches(alice, alice_user, bob, settings):
    settings.CHANNEL_LAYERS = IN_MEMORY
    running = make_batch(alice.org, total=5)

    cookie = session_of(alice_user)

    async def test():
        ws = socket("/ws/batches", cookie)
        assert (await ws.connect())[0]
        assert (await ws.receive_json_from(timeout=ARRIVES_S))["batch"]["id"] == running.public_id
        fresh = await sync_to_async(make_batch)(alice.org, status="validating", total=3)
        await sync_to_async(make_batch)(bob.org, total=3)
        assert (await ws.receive_json_from(timeout=ARRIVES_S))["batch"]["id"] == fresh.public_id
        await _set_counts(running, status="completed", completed_count=5)
        message = await ws.receive_json_from(timeout=ARRIVES_S)
        assert (message["batch"]["id"], message["batch"]["status"]) == (running.public_id, "completed")
        await nothing(ws, consumers.POLL_INTERVAL_S + 0.3)
        await ws.disconnect()

    run(test)


def test_a_cancelled_batchs_not_run_records_go_out_with_its_snapshot_on_both_feeds(alice, alice_user):
    batch = make_batch(
        alice.org, status="cancelled", total=100, completed=30, failed=70, progress=[[1000.0, 0, 0], [1010.0, 30, 5]]
    )
    # The batch page's socket reads the not-run count from the records, with the failures card.
    add_records(batch, RecordStatus.FAILED, "http_400", 5)
    add_records(batch, RecordStatus.CANCELLED, "batch_cancelled", 65)
    cookie, pushed = session_of(alice_user), snapshot(batch)

    async def test():
        ws = socket("/ws/batches", cookie)
        assert (await ws.connect())[0]
        await group_send(live.org_group(alice.org.pk), pushed)  # as the close announces it
        message = await ws.receive_json_from(timeout=ARRIVES_S)
        assert message["batch"]["status"] == "cancelled" and message["not_run"] == 65
        # The tiles as the page renders them: 70 failed of which 65 never ran.
        assert (message["fields"]["failed"], message["fields"]["not_run"]) == ("5", "65")
        assert message["fields"]["retry_label"] == "Retry 70 records (5 failed, 65 not run)"
        await ws.disconnect()
        ws = socket(f"/ws/batches/{batch.public_id}", cookie)
        assert (await ws.connect())[0]
        message = await ws.receive_json_from(timeout=ARRIVES_S)  # read when it connects
        assert message["not_run"] == 65 and "failures" in message
        assert (message["fields"]["failed"], message["fields"]["not_run"]) == ("5", "65")
        await ws.disconnect()

    run(test)
