"""`manage.py up` keeps the dev organization's API key and the dashboard user's password across
restarts, says plainly what it made instead when it can't, and prints the key last."""

import os
import signal
import stat
import subprocess
import sys
import threading
import time

import httpx
import pytest
from django.contrib.auth import get_user_model

from openrelay.core.auth import authenticate_key
from openrelay.core.management.commands.up import CREDENTIALS_FILE, KEPT, Command
from openrelay.core.models import ApiKey
from openrelay.lib import children
from tests.core_tests.test_up import EMBEDDED_ONLY, ROOT
from tests.helpers import free_port


@pytest.fixture
def data_dir(settings, tmp_path):
    settings.DATA_DIR = tmp_path
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast; these tests hash often
    return tmp_path


def start_up():
    """The key/user part of one `manage.py up` start: (key, key note, password, password note)."""
    return Command()._credentials()


@pytest.mark.django_db
class TestCredentials:
    def test_it_makes_a_key_and_a_password_then_keeps_them(self, data_dir):
        key, key_note, password, password_note = start_up()
        assert (key_note, password_note) == ("new", "new")
        assert authenticate_key(key).organization.name == "dev"
        assert stat.S_IMODE((data_dir / CREDENTIALS_FILE).stat().st_mode) == 0o600
        assert start_up() == (key, KEPT, password, KEPT)
        user = get_user_model().objects.get(username="dev")
        assert user.check_password(password) and user.is_staff
        assert ApiKey.objects.count() == 1

    def test_it_replaces_a_revoked_key_and_says_so(self, data_dir):
        key, *_ = start_up()
        authenticate_key(key).revoke()
        new_key, note, _, password_note = start_up()
        assert new_key != key and authenticate_key(new_key) is not None
        assert note.startswith("new: the saved one (") and key[:12] in note and "no longer works" in note
        assert password_note == KEPT
        assert start_up()[:2] == (new_key, KEPT)

    def test_it_keeps_a_password_the_user_changed(self, data_dir):
        start_up()
        user = get_user_model().objects.get(username="dev")
        user.set_password("my-own-password")
        user.save(update_fields=["password"])
        _, _, password, note = start_up()
        assert password is None and note.startswith("the one you set")
        user.refresh_from_db()
        assert user.check_password("my-own-password")

    def test_it_says_what_it_replaced_when_the_saved_file_is_gone(self, data_dir):
        key, _, password, _ = start_up()
        (data_dir / CREDENTIALS_FILE).unlink()
        new_key, key_note, new_password, password_note = start_up()
        assert key_note == "new" and new_key != key
        assert authenticate_key(key) is not None  # a key someone copied keeps working
        assert new_password != password and password_note == "new: it replaces the old one, which up had not saved"


def _output(process, lines):
    for line in process.stdout:
        lines.append(line.rstrip("\n"))


def _run_up(data_dir):
    """Start `manage.py up`; return (process, its output lines so far: stdout and stderr, as a terminal shows)."""
    env = {k: v for k, v in os.environ.items() if k not in EMBEDDED_ONLY}
    env["OPENRELAY_DATA_DIR"] = str(data_dir)
    port = free_port()
    process = children.popen(
        [sys.executable, "manage.py", "up", "--port", str(port), "--simulator-port", str(free_port())],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines = []
    threading.Thread(target=_output, args=(process, lines), daemon=True).start()
    deadline = time.monotonic() + 60
    while "API key:" not in lines[-2:-1]:
        assert process.poll() is None and time.monotonic() < deadline, lines
        time.sleep(0.05)
    return process, lines, f"http://127.0.0.1:{port}"


def _kill(process):
    # Everything up keeps was written before its banner; how it stops is test_up's business.
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=10)


@pytest.mark.slow  # on the embedded defaults whatever the environment: the tier db_independent (pyproject.toml)
def test_a_restart_prints_the_same_key_last(tmp_path):
    seen = []
    for _ in range(2):
        process, lines, base = _run_up(tmp_path)
        try:
            key = lines[-1]
            assert httpx.get(f"{base}/v1/batches", headers={"Authorization": f"Bearer {key}"}).status_code == 200
            password = next(line for line in lines if "Dashboard sign-in" in line).split("password ")[1].split()[0]
            seen.append((key, password, lines))
            assert lines[-1] == key  # nothing printed after it while the product runs
        finally:
            _kill(process)
    (first_key, first_password, first), (second_key, second_password, second) = seen
    assert (second_key, second_password) == (first_key, first_password)
    assert any("The API key is new;" in line for line in first)
    assert any("The API key is the same as last start;" in line for line in second)
    assert any(f"password {first_password}  (the same as last start)" in line for line in second)
