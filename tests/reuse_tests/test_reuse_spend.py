"""A leader's answer bills its twins a share (OPENRELAY_REUSE_BILL_SHARE): the spend cap counts
those shares before the leader's call goes out, so a batch of twins cannot pass its cap."""

from decimal import Decimal

import pytest

from batches import services
from batches.models import Batch, PauseReason, Record
from batches.validation.params import CreateParams
from billing.pricing import batch_cost
from tests.helpers import CHAT, EngineThread, chat, wait_for

pytestmark = pytest.mark.django_db(transaction=True)
NANOS_PER_CALL = 1_000_000  # 100 answer tokens at $10 / 1M
LEADERS, TWINS = 10, 4  # each body five times: a leader and four twins


@pytest.fixture(autouse=True)
def _storage(tmp_storage):
    """Stored files in tmp_path."""


def capped_batch_of_twins(org, cap):
    bodies = [chat(f"[[tokens:100]] q {i}", temperature=0, max_tokens=100) for i in range(LEADERS)] * (TWINS + 1)
    requests = [{"custom_id": f"req-{n}", "method": "POST", "url": CHAT, "body": b} for n, b in enumerate(bodies, 1)]
    batch = services.create_batch(organization=org, params=CreateParams(endpoint=CHAT, requests=requests))
    Batch.objects.filter(pk=batch.pk).update(price_output=Decimal("10"), price_multiplier=1, max_cost_nanos=cap)
    return batch


def test_the_cap_counts_the_twins_share_of_a_leaders_answer(alice, model, fresh_sim, settings):
    settings.OPENRELAY_REUSE_BILL_SHARE = 1.0  # a reused answer bills in full: five calls' worth a leader
    cap = 12 * NANOS_PER_CALL + NANOS_PER_CALL // 2  # two leaders and their twins fit, not a third
    batch = capped_batch_of_twins(alice.org, cap)
    assert Record.objects.filter(batch=batch, status="waiting").count() == LEADERS * TWINS
    with EngineThread(batch.pk):
        wait_for(lambda: Batch.objects.get(pk=batch.pk).paused_at is not None, 30, "the cap to pause the batch")
        wait_for(lambda: not Record.objects.filter(batch=batch, status="running").exists(), 10, "calls to settle")
    batch.refresh_from_db()
    assert batch.pause_reason == PauseReason.SPEND_CAP
    # Before the leaders' reservations counted their twins, all ten ran: 50 calls' worth under a cap of 12.5.
    assert batch_cost(batch).total_nanos <= cap
    assert fresh_sim.request_count == 2
    assert batch.completed_count == 2 * (TWINS + 1)
