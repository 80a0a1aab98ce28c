"""django-q2 entry points. Tasks take ids; the work lives in batches.engine."""

from django.conf import settings
from django.utils import timezone
from django_q.tasks import async_task


def enqueue_batch(batch_pk, *, copies=None):
    """Hand a batch to the workers. Call inside transaction.on_commit.

    Several tasks work one batch at once (each claims its own chunks), so a
    batch spreads over every worker process of every cluster.
    """
    from batches.models import Batch

    Batch.objects.filter(pk=batch_pk).update(enqueued_at=timezone.now())
    for _ in range(copies or settings.OPENRELAY_TASKS_PER_BATCH):
        async_task("batches.tasks.run_batch", batch_pk, task_name=f"batch-{batch_pk}", group="batches")


def run_batch(batch_pk):
    from batches.engine.runner import run_batch as run

    return run(batch_pk)


def sweep():
    from batches.engine.sweeper import sweep as run_sweep

    return run_sweep()
