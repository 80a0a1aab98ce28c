"""Prefix-aware dispatch (batches.engine.prefixes): keys read from input lines, records grouped by
them, a key's calls sent to one deployment while it has room."""

import asyncio
import random

import orjson

from batches.engine.fairness import CallGate, OrgCaps, Ticket
from batches.engine.prefixes import RecordQueue, current_key, home_of, prefix_key
from batches.engine.store import ClaimedRecord

SYSTEM = [f"You are assistant number {i}. " + "Follow the house rules closely. " * 60 for i in range(5)]


def line(i, system, question=None):
    body = {
        "model": "m",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question or f"question {i}"}],
    }
    return orjson.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": body})


def claimed(i, raw, size=1024):
    return ClaimedRecord(pk=i, line=i, custom_id=f"r{i}", offset=0, length=len(raw), prefix=prefix_key(raw, size)), raw


def test_records_sharing_a_long_system_prompt_share_a_key_and_others_do_not():
    assert prefix_key(line(1, SYSTEM[0]), 1024) == prefix_key(line(2, SYSTEM[0]), 1024)
    assert prefix_key(line(1, SYSTEM[0]), 1024) != prefix_key(line(1, SYSTEM[1]), 1024)
    # A short prompt has no long prefix to share; 0 turns the feature off.
    assert prefix_key(line(1, "Be brief."), 1024) is None
    assert prefix_key(line(1, SYSTEM[0]), 0) is None
    # Completions and embeddings spell their prompt differently.
    prompt = orjson.dumps({"custom_id": "c", "body": {"model": "m", "prompt": SYSTEM[2] + "tail"}})
    assert prefix_key(prompt, 1024) is not None


def test_the_queue_serves_each_prefix_group_whole_and_keeps_keyless_records_in_order():
    rng = random.Random(7)
    raws = [line(i, rng.choice(SYSTEM)) for i in range(200)]
    queue = RecordQueue(claimed(i, raw) for i, raw in enumerate(raws))
    assert queue.shared() and len(queue) == 200
    order = [queue.popleft()[0] for _ in range(200)]
    assert not queue
    switches = sum(1 for a, b in zip(order, order[1:]) if a.prefix != b.prefix)
    assert switches == len(SYSTEM) - 1  # five runs, one a system prompt
    assert sorted(r.line for r in order) == list(range(200))

    short = RecordQueue(claimed(i, line(i, "Be brief.")) for i in range(10))
    assert not short.shared()
    assert [short.popleft()[0].line for _ in range(10)] == list(range(10))


def test_records_claimed_later_join_their_group_while_it_waits_and_a_drained_group_queues_anew():
    queue = RecordQueue([claimed(1, line(1, SYSTEM[0])), claimed(2, line(2, SYSTEM[1]))])
    first = queue.popleft()[0]  # SYSTEM[0]'s group is drained
    queue.extend([claimed(3, line(3, SYSTEM[1])), claimed(4, line(4, SYSTEM[0]))])
    assert [first.line] + [queue.popleft()[0].line for _ in range(3)] == [1, 2, 3, 4]


def test_the_queue_counts_its_records_marked_ahead_until_they_leave_it():
    """trips.SentMarks caps the records marked ahead by the queue's `marked`, not a walk of it:
    a record leaves the count as it leaves the queue, started or given back."""
    queue = RecordQueue(claimed(i, line(i, "Be brief.")) for i in range(6))
    queue.marked |= {0, 1, 4}
    assert queue.popleft()[0].pk == 0 and queue.marked == {1, 4}
    rebuilt = RecordQueue(list(queue), queue.marked)  # a take-over's records put first keep the count
    assert rebuilt.popleft()[0].pk == 1 and rebuilt.marked == {4}
    rebuilt.clear()  # handed back unstarted: no longer this engine's to start
    assert rebuilt.marked == set()


class Deployment:
    def __init__(self, pk, share):
        self.affinity_seed = str(pk).encode()
        self.share = self.allotted = share
        self.in_use = 0
        self.healthy = True


def test_a_key_has_one_home_on_every_engine_and_a_deployment_leaving_moves_only_its_keys():
    one, two, three = Deployment(1, 8), Deployment(2, 8), Deployment(3, 8)
    keys = range(0, 2**32, 2**24)
    homes = {key: home_of(key, [one, two, three]) for key in keys}
    assert {home for home in homes.values()} == {one, two, three}
    assert all(home_of(key, [three, one, two]) is homes[key] for key in keys)  # order does not matter
    assert all(home_of(key, [one, three]) is homes[key] for key in keys if homes[key] is not two)


def test_the_gate_sends_a_key_to_its_home_while_it_has_room_and_elsewhere_when_full():
    async def scenario():
        one, two = Deployment(1, 2), Deployment(2, 2)
        gate = CallGate(OrgCaps())
        gate.upstreams = [one, two]
        key = next(k for k in range(1000) if home_of(k, [one, two]) is one)
        current_key.set(key)
        ticket = Ticket(1, 1)
        got = [await gate.acquire(ticket) for _ in range(3)]
        assert got == [one, one, two]  # home first; full, so the call goes where there is room
        gate.release(ticket, got[0])
        assert await gate.acquire(ticket) is one

    asyncio.run(scenario())
