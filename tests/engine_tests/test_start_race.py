"""Several tasks start on one batch at once; the ones that lose the validating -> in_progress race still work it."""

from django.utils import timezone

from batches import lifecycle
from batches.engine.runner import run_batch
from batches.models import Batch
from tests.helpers import chat, make_batch


def test_an_engine_that_loses_the_start_race_still_runs_records(alice, model, monkeypatch):
    batch = make_batch(alice.org, [chat("a"), chat("b"), chat("c")])
    assert batch.status == "validating"
    real_transition = lifecycle.transition

    def another_engine_won(target_batch, target, **fields):
        if target == "in_progress":
            Batch.objects.filter(pk=target_batch.pk).update(status="in_progress", in_progress_at=timezone.now())
            return False
        return real_transition(target_batch, target, **fields)

    monkeypatch.setattr(lifecycle, "transition", another_engine_won)
    assert run_batch(batch.pk) == 3
    batch.refresh_from_db()
    assert batch.status == "completed" and batch.completed_count == 3
