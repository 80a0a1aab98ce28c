"""Issue 55, item 3: reading records' lines from local storage never imports the S3 backend.

`open_records` imported storages.backends.s3 (and with it boto3) on every call for an isinstance
check: 0.11-0.14 s of CPU in each worker's first batch on a cluster that stores files locally.
A fresh interpreter shows what a worker process pays.
"""

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_open_records_on_local_storage_imports_no_s3_backend(tmp_path):
    script = textwrap.dedent(
        """
        import io, os, sys
        os.environ["DJANGO_SETTINGS_MODULE"] = "openrelay.settings"
        import django
        django.setup()
        from django.core.files.storage import default_storage
        from files.storage import open_records

        name = default_storage.save("input.jsonl", io.BytesIO(b'{"custom_id": "a"}\\n'))
        with open_records(default_storage, name) as reader:
            assert reader.read() == b'{"custom_id": "a"}\\n'
        print(sorted(m for m in ("boto3", "botocore", "storages.backends.s3") if m in sys.modules))
        """
    )
    env = {"PATH": "/usr/bin:/bin", "OPENRELAY_DATA_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"
