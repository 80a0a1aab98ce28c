"""django-q2 entry points. Tasks take ids; the work lives in batches.engine.

Records are not tasks: every worker process's engine claims them from the
database (batches.engine.process), so creating a batch enqueues nothing.
"""


def sweep():
    from batches.engine.sweeper import sweep as run_sweep

    return run_sweep()


def warn_at_risk():
    from batches.risk import warn_at_risk as warn

    return warn()
