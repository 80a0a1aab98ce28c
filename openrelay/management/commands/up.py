"""`python manage.py up`: the whole product on one machine, in one command.

Migrates, makes sure a development organization exists and prints a fresh
API key for it and a fresh password for its dashboard user `dev`, starts the
simulated model server and registers a model on it, then runs the ASGI web
server (uvicorn: HTTP + websockets) and a django-q2 cluster until Ctrl-C.
"""

import os
import secrets
import signal
import subprocess
import sys
import time

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand

from openrelay.models import ApiKey, Membership, Organization

DEV_ORG = "dev"
DEV_KEY_NAME = "printed by manage.py up"
DEV_USER = "dev"
DEFAULT_MODEL = "openrelay/gemma-4-31b"


class Command(BaseCommand):
    help = "Run web + workers + simulated model server on the embedded defaults, printing the URL and an API key."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--simulator-port", type=int, default=8001)
        parser.add_argument("--no-simulator", action="store_true", help="Do not start the simulated model server.")
        parser.add_argument("--model", default=DEFAULT_MODEL, help="Public name of the simulated model.")

    def handle(self, host, port, simulator_port, no_simulator, model, **options):
        # A plain `kill` must stop the children too, like Ctrl-C does.
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        call_command("migrate", interactive=False, verbosity=0)
        key = self._dev_key()
        password = self._dev_user()
        children = []
        try:
            if not no_simulator:
                children.append(self._spawn([sys.executable, "-m", "openrelay.simulator", "--host", "127.0.0.1", "--port", str(simulator_port), "--latency-ms", "50"]))
                call_command("set_model", model, base_url=f"http://127.0.0.1:{simulator_port}/v1", concurrency=64,
                             input_price="0.20", cached_input_price="0.05", output_price="0.80", stdout=self.stdout)
            children.append(self._spawn([sys.executable, "manage.py", "qcluster"]))
            children.append(self._spawn([sys.executable, "-m", "uvicorn", "--host", host, "--port", str(port),
                                          "--no-access-log", "openrelay.asgi:application"]))
            self._banner(host, port, key, model, password)
            self._supervise(children)
        except KeyboardInterrupt:
            pass
        finally:
            self._stop(children)

    def _dev_key(self):
        org, _ = Organization.objects.get_or_create(name=DEV_ORG, defaults={"workflows_enabled": True})
        # The plaintext of old keys is stored nowhere, so every start prints a new one.
        for old in ApiKey.objects.active().filter(organization=org, name=DEV_KEY_NAME):
            old.revoke()
        return ApiKey.issue(org, name=DEV_KEY_NAME)[1]

    def _dev_user(self):
        """A dashboard (and admin) user `dev` in the dev organization, with a fresh password each start."""
        org = Organization.objects.get(name=DEV_ORG)
        user, _ = get_user_model().objects.get_or_create(username=DEV_USER, defaults={"is_staff": True, "is_superuser": True})
        password = secrets.token_urlsafe(12)
        user.set_password(password)
        user.save(update_fields=["password"])
        Membership.objects.update_or_create(user=user, defaults={"organization": org})
        return password

    def _spawn(self, argv):
        return subprocess.Popen(argv, cwd=settings.BASE_DIR, env=os.environ.copy())

    def _banner(self, host, port, key, model, password):
        url = f"http://{host}:{port}"
        self.stdout.write(self.style.SUCCESS(f"\nOpenRelay Batch is running at {url}  (dashboard {url}/, API {url}/v1)"))
        self.stdout.write(f"Dashboard sign-in: user {DEV_USER}, password {password}    Model: {model}    Data: {settings.DATA_DIR}")
        self.stdout.write(f"export OPENAI_BASE_URL={url}/v1 OPENRELAY_BASE_URL={url}/v1")
        self.stdout.write(f"export OPENAI_API_KEY={key} OPENRELAY_API_KEY={key}")
        self.stdout.write("API key:")
        self.stdout.write(key)

    def _supervise(self, children):
        while all(child.poll() is None for child in children):
            time.sleep(0.5)
        failed = [c.args for c in children if c.poll() is not None]
        self.stderr.write(f"A process stopped: {failed}; shutting down.")

    def _stop(self, children):
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for child in children:
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
