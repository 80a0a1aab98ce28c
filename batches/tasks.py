"""django-q2 entry points. Tasks take ids; the work lives in batches.engine."""

from django_q.tasks import async_task


def enqueue_batch(batch_pk, *, copies=1):
    """Hand a batch to the workers. Call inside transaction.on_commit."""
    for _ in range(copies):
        async_task("batches.tasks.run_batch", batch_pk, task_name=f"batch-{batch_pk}", group="batches")


def run_batch(batch_pk):
    from batches.engine.runner import run_batch as run

    return run(batch_pk)


def sweep():
    from batches.engine.sweeper import sweep as run_sweep

    return run_sweep()
