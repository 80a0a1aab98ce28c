"""`python manage.py up`: the whole product on one machine, in one command.

Migrates, makes sure a development organization exists with an API key and
a dashboard user `dev`, starts the simulated model server and registers a
model on it, then runs the ASGI web server (uvicorn: HTTP + websockets) and a
django-q2 cluster until Ctrl-C. Once the web server answers it prints where
everything is, the API key last.

The key and the password are kept in the data dir (dev-credentials.json,
readable by its owner only), so a restart prints the same ones: the plaintext
of a key is stored nowhere else. When one can't be kept (the file is gone,
the key was revoked) the banner says what was made instead.
"""

import json
import os
import secrets
import signal
import socket
import sys
import time
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand

from openrelay.core.auth import authenticate_key
from openrelay.core.models import ApiKey, Membership, Organization
from openrelay.lib import children

DEV_ORG = "dev"
DEV_KEY_NAME = "printed by manage.py up"
DEV_USER = "dev"
DEFAULT_MODEL = "openrelay/gemma-4-31b"
CREDENTIALS_FILE = "dev-credentials.json"
KEPT = "the same as last start"


class Command(BaseCommand):
    help = "Run web + workers + simulated model server on the embedded defaults, printing the URL and an API key."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--simulator-port", type=int, default=8001)
        parser.add_argument("--no-simulator", action="store_true", help="Do not start the simulated model server.")
        parser.add_argument("--model", default=DEFAULT_MODEL, help="Public name of the simulated model.")

    def handle(self, host, port, simulator_port, no_simulator, model, **options):
        # A plain `kill` must stop the children too, like Ctrl-C does; a second of either stops them at once.
        self._at_once = False
        for number in (signal.SIGINT, signal.SIGTERM):
            signal.signal(number, self._interrupted)
        call_command("migrate", interactive=False, verbosity=0)
        key, key_note, password, password_note = self._credentials()
        # The children log warnings and errors only, so the banner stays the last thing printed.
        os.environ.setdefault("OPENRELAY_LOG_LEVEL", "WARNING")
        os.environ["OPENRELAY_DEV_KEY_NOTED"] = "true"  # this process warned already (settings.py)
        children = []
        try:
            if not no_simulator:
                children.append(
                    self._spawn(
                        [
                            sys.executable,
                            "-m",
                            "openrelay.simulator",
                            "--host",
                            "127.0.0.1",
                            "--port",
                            str(simulator_port),
                            "--latency-ms",
                            "50",
                        ]
                    )
                )
                call_command(
                    "set_model",
                    model,
                    base_url=f"http://127.0.0.1:{simulator_port}/v1",
                    concurrency=64,
                    input_price="0.20",
                    cached_input_price="0.05",
                    output_price="0.80",
                    stdout=self.stdout,
                )
            children.append(self._spawn([sys.executable, "manage.py", "qcluster"]))
            # openrelay.web.webserver's protocol: request heads capped while they are read (431).
            children.append(
                self._spawn(
                    [
                        sys.executable,
                        "-m",
                        "uvicorn",
                        "--host",
                        host,
                        "--port",
                        str(port),
                        "--http",
                        "openrelay.web.webserver:HttpToolsProtocol",
                        "--no-access-log",
                        "--log-level",
                        "warning",
                        "openrelay.asgi:application",
                    ]
                )
            )
            if self._wait_until_listening(children, host, port):
                self._banner(host, port, model, key, key_note, password, password_note)
            self._supervise(children)
        except KeyboardInterrupt:
            pass
        finally:
            self._stop(children)

    def _credentials(self):
        """(API key, what the banner says of it, password or None, what it says of that), kept in the data dir."""
        saved = self._saved_credentials()
        key, key_note = self._dev_key(saved.get("api_key"))
        password, password_note = self._dev_user(saved.get("password"))
        self._save_credentials({"api_key": key, "password": password or saved.get("password")})
        return key, key_note, password, password_note

    def _credentials_path(self):
        return Path(settings.DATA_DIR) / CREDENTIALS_FILE

    def _saved_credentials(self):
        try:
            saved = json.loads(self._credentials_path().read_text())
        except (OSError, ValueError):
            saved = None
        if not isinstance(saved, dict):
            return {}
        return {name: value for name, value in saved.items() if isinstance(value, str)}

    def _save_credentials(self, credentials):
        fd = os.open(self._credentials_path(), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # also when an older file had wider permissions
        with os.fdopen(fd, "w") as out:
            json.dump(credentials, out)

    def _dev_key(self, saved_key):
        """(the dev organization's API key, what the banner says of it): the saved key while it works."""
        org, _ = Organization.objects.get_or_create(name=DEV_ORG, defaults={"workflows_enabled": True})
        found = authenticate_key(saved_key) if saved_key else None
        if found is not None and found.organization_id == org.pk:
            return saved_key, KEPT
        key = ApiKey.issue(org, name=DEV_KEY_NAME)[1]
        if not saved_key:
            return key, "new"
        return key, f"new: the saved one ({saved_key[:12]}...) no longer works (revoked, or another database)"

    def _dev_user(self, saved_password):
        """(the password of the dashboard and admin user `dev`, or None when it is the user's own; the note)."""
        org = Organization.objects.get(name=DEV_ORG)
        user, created = get_user_model().objects.get_or_create(
            username=DEV_USER, defaults={"is_staff": True, "is_superuser": True}
        )
        Membership.objects.update_or_create(user=user, defaults={"organization": org})
        if not created and saved_password:
            if user.check_password(saved_password):
                return saved_password, KEPT
            # Changed since up saved it (in the admin, or manage.py changepassword): it stays.
            return None, "the one you set (manage.py changepassword dev to change it)"
        password = secrets.token_urlsafe(12)
        user.set_password(password)
        user.save(update_fields=["password"])
        return password, "new" if created else "new: it replaces the old one, which up had not saved"

    def _wait_until_listening(self, children, host, port, timeout=60):
        """Wait for the web server to accept connections (the children's start-up output is then done);
        False if a child stopped first or it took too long."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and all(child.poll() is None for child in children):
            try:
                socket.create_connection((host, port), timeout=0.5).close()
                return True
            except OSError:
                time.sleep(0.1)
        return False

    def _spawn(self, argv):
        # A session of its own: Ctrl-C in the terminal reaches this command alone, which then
        # stops the children in order (a simulator that stopped first failed the calls in flight).
        # Should this command die without stopping them (kill -9), they get SIGTERM from the kernel:
        # the workers hand their records back first (openrelay/lib/children.py).
        return children.popen(
            argv,
            cwd=settings.BASE_DIR,
            env=os.environ.copy(),
            start_new_session=True,
            death_signal=signal.SIGTERM,
        )

    def _banner(self, host, port, model, key, key_note, password, password_note):
        url = f"http://{host}:{port}"
        shown = f"password {password}  ({password_note})" if password else f"password: {password_note}"
        self.stdout.write(
            self.style.SUCCESS(f"\nOpenRelay Batch is running at {url}  (dashboard {url}/, API {url}/v1)")
        )
        self.stdout.write(f"Model: {model}    Data: {settings.DATA_DIR}")
        self.stdout.write(f"Dashboard sign-in: user {DEV_USER}, {shown}")
        self.stdout.write(f"export OPENAI_BASE_URL={url}/v1 OPENRELAY_BASE_URL={url}/v1")
        self.stdout.write(f"export OPENAI_API_KEY={key} OPENRELAY_API_KEY={key}")
        self.stdout.write(f"The API key is {key_note}; restarts keep it (saved in {self._credentials_path()}).")
        self.stdout.write("API key:")
        self.stdout.write(key)
        self.stdout.flush()

    def _supervise(self, children):
        while all(child.poll() is None for child in children):
            time.sleep(0.5)
        failed = [c.args for c in children if c.poll() is not None]
        self.stderr.write(f"A process stopped: {failed}; shutting down.")

    def _interrupted(self, signum, frame):
        """The first Ctrl-C or SIGTERM: from now on either one only asks to stop at once. The handler is
        swapped here, in the handler itself, so no second signal can land as an exception mid-stop."""
        for number in (signal.SIGINT, signal.SIGTERM):
            signal.signal(number, self._stop_at_once)
        raise KeyboardInterrupt

    def _stop_at_once(self, signum, frame):
        self._at_once = True

    def _stop(self, children):
        """Stop the children in the reverse of their start: the web server, then the workers (whose
        engines finish or hand back their records within OPENRELAY_STOP_GRACE_S), and the simulator
        last, so no record is ever sent to a model server that is already gone. Each step is said as
        it starts, since the workers' may take seconds; a second Ctrl-C (or SIGTERM) stops the rest
        at once, in the same order: a worker killed mid-call leaves its records to its lease, and the
        next start runs them (none is written off)."""
        running = [child for child in reversed(children) if child.poll() is None]
        if not running:
            return
        self.stderr.write("Stopping. Press Ctrl-C again to stop at once.")
        said_at_once = False
        for child in running:
            if not self._at_once:
                self._stop_one(child)
            if self._at_once and child.poll() is None:
                if not said_at_once:
                    self.stderr.write("Stopping at once: records in flight run again at the next start.")
                    said_at_once = True
                _kill(child)
        self.stderr.write("Stopped.")

    def _stop_one(self, child):
        """SIGTERM, then wait for the child to end: until its patience runs out (then SIGKILL) or a second
        Ctrl-C asks to stop at once (the caller kills it)."""
        name, detail, patience = _role(child)
        if child.poll() is not None:
            return
        self.stderr.write(f"Stopping {name}{detail} (at most {patience:.0f} s)...")
        child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + patience
        while child.poll() is None and not self._at_once:
            if time.monotonic() >= deadline:
                self.stderr.write(f"{name[0].upper()}{name[1:]} did not stop in {patience:.0f} s: killed.")
                _kill(child)
                return
            time.sleep(0.05)


def _role(child):
    """(what the console calls a child, what stopping it does, how long it may take)."""
    argv = " ".join(map(str, child.args))
    if "qcluster" in argv:
        return "the workers", ": calls in flight finish or go back to the queue", settings.OPENRELAY_STOP_GRACE_S + 15
    if "openrelay.simulator" in argv:
        return "the simulated model server", "", 10
    return "the web server", "", 10


def _kill(child):
    """SIGKILL to the child's own process group (a cluster's forked workers too)."""
    if child.poll() is None:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    child.wait()
