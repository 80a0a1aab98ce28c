"""Where a test run keeps its data: a temporary folder unless OPENRELAY_DATA_DIR names one.

Loaded with `-p tests.dataroot` (pyproject's addopts) so it runs before pytest-django
imports the settings, which read OPENRELAY_DATA_DIR once. Without it, README's test
command left test databases, logs and screenshots in the checkout's ./var. A folder made
here is removed when the run ends; to keep a run's screenshots and logs, name the folder:
OPENRELAY_DATA_DIR=/some/dir python -m pytest.
"""

import os
import shutil
import tempfile

_made = None
if not os.environ.get("OPENRELAY_DATA_DIR"):
    _made = tempfile.mkdtemp(prefix="openrelay-tests-")
    os.environ["OPENRELAY_DATA_DIR"] = _made


def pytest_unconfigure(config):
    if _made:
        shutil.rmtree(_made, ignore_errors=True)
