"""A kill -9 in the middle of re-asks: the record resumes at its checkpoint, no finished turn sent again."""

from collections import Counter

import pytest

from tests.contract_tests.conftest import content_of, person_format
from tests.helpers import CHAT, assert_exactly_once, chat, make_batch, status_of, wait_for

# Short leases: a killed cluster's records are claimable again within 2 s.
FAST = {"OPENRELAY_LEASE_S": 2}
RECORDS = 6


def text(i):
    return f"Person {i} [[invalid_output:wrong_typex3]] [[latency:400]]"


@pytest.mark.slow
def test_kill_9_mid_reasks_resumes_without_sending_a_finished_turn_again(alice, model, sim, clusters):
    contract = {"output_contract": {"max_reasks": 3}}
    bodies = [chat(text(i), response_format=person_format(), openrelay=contract) for i in range(RECORDS)]
    batch = make_batch(alice.org, bodies)

    def sent(i):
        """How many times each conversation length (1: the first ask, 3, 5, 7: the re-asks) was sent."""
        return Counter(len(b["messages"]) for b in sim.bodies(CHAT) if b["messages"][0]["content"] == text(i))

    first = clusters(**FAST)
    wait_for(lambda: all(sum(sent(i).values()) >= 2 for i in range(RECORDS)), 60, "every record's first re-ask")
    first.kill()
    assert all(sum(sent(i).values()) < 4 for i in range(RECORDS)), "a record finished before the kill"
    clusters(**FAST)
    wait_for(lambda: status_of(batch) == "completed", 90, "the batch to complete")
    out, err = assert_exactly_once(batch, RECORDS)
    assert not err
    for item in out:
        assert item["response"]["body"]["openrelay"] == {"reasks": 3}
        assert content_of(item) == {"name": "sim", "age": 0}
    repeats = 0
    for i in range(RECORDS):
        counts = sent(i)
        assert set(counts) == {1, 3, 5, 7}, counts
        # At most the call in flight at the kill went twice; every finished turn went once.
        assert sum(counts.values()) <= 5 and max(counts.values()) <= 2, counts
        repeats += sum(counts.values()) - 4
    assert repeats > 0, "no re-ask was in flight at the kill: the test proved nothing"
    batch.refresh_from_db()
    assert (batch.reasked_count, batch.reasks_count, batch.invalid_output_count) == (RECORDS, 3 * RECORDS, 0)
