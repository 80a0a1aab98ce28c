"""The CLI stands alone: no Django, no settings, just the installed console script."""

import os
import subprocess
import sys
from pathlib import Path

SERVER_PACKAGES = ("django", "rest_framework", "django_q", "channels", "batches", "files", "billing")


def test_it_imports_nothing_of_the_server():
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    probe = (
        "import sys, openrelay.cli.app; "
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({SERVER_PACKAGES!r})))"
    )
    result = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_it_shows_help_without_a_key_or_a_server():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENRELAY_", "DJANGO_"))}
    orl = Path(sys.executable).parent / "orl"
    result = subprocess.run([orl, "batches", "create", "--help"], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert "--input-file" in result.stdout and "--priority" in result.stdout
