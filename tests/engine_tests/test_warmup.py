"""Issue 55, item 3: a worker's engine pays its record path's one-time costs as it starts.

A fresh cluster's first batch cost its workers 0.244 ms of CPU a record against 0.142-0.150 ms
for the next ones; what a worker did for the first time inside it (imports, the channel layer's
connection) is done before its engine's first heartbeat now. A fresh interpreter shows what a
worker process pays: after the warm-up, the first batch's live event imports nothing.
(bench row 19 measures the CPU a record.)
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_after_the_warm_up_the_first_live_event_imports_nothing(tmp_path):
    script = textwrap.dedent(
        """
        import asyncio, os, sys
        os.environ["DJANGO_SETTINGS_MODULE"] = "openrelay.settings"
        import django
        django.setup()
        from batches.engine import runner, warmup
        from batches import live

        async def main():
            await warmup.warm()
            before = set(sys.modules)
            from batches.presenters import live_batch_object  # noqa: F401 - live.snapshots' import
            await live.send({"organization_id": 0, "batch": {"id": "batch_warmup_test"}})
            return sorted(set(sys.modules) - before)

        print(asyncio.run(main()))
        """
    )
    env = {"PATH": "/usr/bin:/bin", "OPENRELAY_DATA_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    if os.environ.get("REDIS_URL"):
        env["REDIS_URL"] = os.environ["REDIS_URL"]  # the layer operators run: channels-redis
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"
