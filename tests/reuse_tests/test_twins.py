"""Identical records of a batch run once (batches.reuse): which records are twins at create, and
how a leader's flush settles its twins in the same transaction."""

import pytest

from batches import services
from batches.engine import store
from batches.engine.cut import close_unfinished
from batches.models import Batch, Record
from batches.validation.params import CreateParams
from tests.helpers import MODEL, answered, chat

CHAT = "/v1/chat/completions"
EMBEDDINGS = "/v1/embeddings"
OWNER = "host:1:test"  # the leases a test claims under (no engine runs)


def create(org, bodies, reuse="auto", endpoint=CHAT):
    requests = [
        {"custom_id": f"req-{i}", "method": "POST", "url": endpoint, "body": body}
        for i, body in enumerate(bodies, start=1)
    ]
    return services.create_batch(
        organization=org, params=CreateParams(endpoint=endpoint, requests=requests, reuse=reuse)
    )


def states(batch):
    return list(Record.objects.filter(batch=batch).order_by("line").values_list("status", "leader_line", "twins"))


def test_deterministic_identical_bodies_are_twins_of_the_first(alice, model):
    same = chat("q", temperature=0)
    reordered = {"temperature": 0, "messages": [{"content": "q", "role": "user"}], "model": MODEL}
    batch = create(alice.org, [same, chat("other", temperature=0), reordered, chat("q", seed=7), chat("q", seed=7)])
    assert states(batch) == [
        ("pending", None, 1),
        ("pending", None, 0),
        ("waiting", 1, 0),  # key order is no difference
        ("pending", None, 1),
        ("waiting", 4, 0),  # a seed pins the answer too
    ]
    assert Batch.objects.get(pk=batch.pk).twin_count == 2


@pytest.mark.parametrize(
    ("body", "mode", "merged"),
    [
        (chat("q"), "auto", False),  # temperature left out: the model samples
        (chat("q", temperature=0.7), "auto", False),
        (chat("q", temperature=0, n=2), "auto", False),
        (chat("q", temperature=0.7), "identical", True),  # the user accepts one sample
        (chat("q", temperature=0), "off", False),
        (chat("q", temperature=0), "cache", True),
        # Tool-calling records never: their tools have effects.
        (chat("q", temperature=0, openrelay={"tool_config": {"url": "https://tools.example/run"}}), "identical", False),
    ],
)
def test_which_records_are_merged(alice, model, body, mode, merged):
    batch = create(alice.org, [body, body], reuse=mode)
    assert [status for status, _, _ in states(batch)][1:] == ["waiting" if merged else "pending"]


def test_embeddings_merge_without_a_temperature(alice, model):
    body = {"model": MODEL, "input": "a chunk"}
    batch = create(alice.org, [body, body, body], endpoint=EMBEDDINGS)
    assert [s for s, _, _ in states(batch)] == ["pending", "waiting", "waiting"]


def test_a_leaders_flush_settles_its_twins(alice, model):
    same = chat("q", temperature=0)
    batch = create(alice.org, [same, same, chat("other", temperature=0), same])
    claimed = store.claim(batch.pk, OWNER, 10)
    assert [r.custom_id for r in claimed] == ["req-1", "req-3"]  # twins are never claimed
    assert [r.twins for r in claimed] == [2, 0]
    outcomes = {r.pk: answered(10) for r in claimed}
    assert store.flush(batch.pk, OWNER, [(r, outcomes[r.pk]) for r in claimed]) == 2
    rows = {r.custom_id: r for r in Record.objects.filter(batch=batch)}
    for twin in ("req-2", "req-4"):
        assert rows[twin].status == "succeeded"
        assert rows[twin].response_body == rows["req-1"].response_body
        assert rows[twin].reused_from == "req-1"
        assert (rows[twin].prompt_tokens, rows[twin].completion_tokens) == (0, 0)  # a reused answer bills nothing
    batch.refresh_from_db()
    assert (batch.completed_count, batch.failed_count, batch.reused_count) == (4, 0, 2)
    assert (batch.input_tokens, batch.output_tokens) == (20, 2)  # the two calls
    assert (batch.reused_input_tokens, batch.reused_output_tokens) == (20, 2)  # saved


def test_a_reused_answer_bills_the_configured_share(alice, model, settings):
    settings.OPENRELAY_REUSE_BILL_SHARE = 0.5
    same = chat("q", temperature=0)
    batch = create(alice.org, [same, same])
    (leader,) = store.claim(batch.pk, OWNER, 10)
    store.flush(batch.pk, OWNER, [(leader, answered(11))])
    batch.refresh_from_db()
    twin = Record.objects.get(batch=batch, line=2)
    assert (twin.prompt_tokens, twin.completion_tokens) == (5, 0)  # 11 * 0.5 and 1 * 0.5, floored
    assert (batch.input_tokens, batch.output_tokens) == (16, 1)
    assert (batch.reused_input_tokens, batch.reused_output_tokens) == (6, 1)


def test_a_failed_leader_fails_its_twins_the_same_way(alice, model):
    from batches.engine.outcomes import RecordOutcome

    same = chat("q", temperature=0)
    batch = create(alice.org, [same, same])
    (leader,) = store.claim(batch.pk, OWNER, 10)
    store.flush(batch.pk, OWNER, [(leader, RecordOutcome.error("upstream_error", "boom"))])
    twin = Record.objects.get(batch=batch, line=2)
    assert (twin.status, twin.error_code, twin.error_message, twin.reused_from) == (
        "failed",
        "upstream_error",
        "boom",
        "req-1",
    )
    batch.refresh_from_db()
    assert (batch.completed_count, batch.failed_count) == (0, 2)


def test_a_cancel_cuts_waiting_twins(alice, model):
    same = chat("q", temperature=0)
    batch = create(alice.org, [same, same, same])
    assert close_unfinished(batch.pk, "cancelled", "batch_cancelled", "cancelled") == 3
    assert set(Record.objects.filter(batch=batch).values_list("status", flat=True)) == {"cancelled"}
