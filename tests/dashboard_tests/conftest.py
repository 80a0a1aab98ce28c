"""Dashboard fixtures: signed-in members of alice's and bob's organizations, storage in tmp_path; the
websockets' channel layer; the browser tests' processes, Chromium and sign-in."""

import copy
import os
from pathlib import Path

import orjson
import pytest
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.db import connections
from django.test import Client
from playwright.sync_api import sync_playwright

from batches.models import Record
from openrelay.core.models import Deployment, Membership, Model, Organization, Price
from tests import processes as processes_module

PASSWORD = "correct horse battery staple"
MODEL = "openrelay/gemma-4-31b"
CHAT = "/v1/chat/completions"


@pytest.fixture(autouse=True)
def _storage(tmp_storage):
    """Every dashboard test keeps its stored files in tmp_path."""


@pytest.fixture(autouse=True)
def _fast_passwords(request, settings):
    # PBKDF2's 1M rounds cost ~0.4 s a user; these passwords protect nothing. A browser test signs in
    # through a server process of its own, which checks passwords with the default hashers.
    if {"processes", "live_stack"} & set(request.fixturenames):
        return
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def make_member(django_user_model, username, org):
    user = django_user_model.objects.create_user(username, password=PASSWORD)
    Membership.objects.create(user=user, organization=org)
    return user


@pytest.fixture
def alice_user(alice, django_user_model):
    return make_member(django_user_model, "alice", alice.org)


@pytest.fixture
def bob_user(bob, django_user_model):
    return make_member(django_user_model, "bob", bob.org)


@pytest.fixture
def alice_client(client, alice_user):
    client.force_login(alice_user)
    return client


@pytest.fixture
def gemma(db):
    return Model.objects.create(name=MODEL)


def chat_line(custom_id, content="hello", **extra):
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": CHAT,
        "body": {"model": MODEL, "messages": [{"role": "user", "content": content}]},
        **extra,
    }


def jsonl(*records):
    return b"".join((orjson.dumps(r) if isinstance(r, dict) else r) + b"\n" for r in records)


def page_html(response):
    assert response.status_code == 200, response.status_code
    return response.content.decode()


def post_upload(client, content, filename="requests.jsonl", **fields):
    """The New batch form posted with `content` as the dropped file (None: no file)."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    data = {"endpoint": "/v1/chat/completions", "priority": "standard", **fields}
    if content is not None:
        data["file"] = SimpleUploadedFile(filename, content, content_type="application/jsonl")
    return client.post("/batches/new", data)


# ---------------------------------------------------------------------------
# Websockets (test_consumers.py, test_one_truth.py, test_operator.py)


@pytest.fixture
def fresh_layer(settings):
    """A new layer object for each test: a layer's queues belong to the event loop that made them,
    and each test runs its own loop. On Redis, a prefix of this process's own: other test runs
    sharing the Redis have organizations with the same ids (each test database counts from 1)."""
    layers = copy.deepcopy(settings.CHANNEL_LAYERS)
    if "redis" in layers["default"]["BACKEND"].lower():
        layers["default"].setdefault("CONFIG", {})["prefix"] = f"dashboard-tests-{os.getpid()}"
    settings.CHANNEL_LAYERS = layers


def session_of(user):
    client = Client()
    client.force_login(user)
    return [(b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())]


def socket(path, session=()):
    from channels.testing import WebsocketCommunicator

    from openrelay.asgi import application

    return WebsocketCommunicator(application, path, headers=list(session))


def add_records(batch, status, code, n):
    start = batch.records.count()
    Record.objects.bulk_create(
        Record(batch=batch, line=start + i, custom_id=f"{code}-{i}", offset=0, length=1, status=status, error_code=code)
        for i in range(n)
    )


# ---------------------------------------------------------------------------
# The browser (test_browser*.py): the product in processes of the test's own, Chromium driving it

SHOTS = Path(django_settings.DATA_DIR) / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture
def member(transactional_db):
    org = Organization.objects.create(name="acme")
    user = get_user_model().objects.create_user("ada", password=PASSWORD)
    Membership.objects.create(user=user, organization=org)
    return org


@pytest.fixture
def processes(transactional_db, tmp_path):
    """Processes of the test's own (a web server with no cluster beside it, or daphne); tests that need
    the running product take `live_stack` (tests/fixtures/live_stack.py)."""
    procs = processes_module.Processes(tmp_path / "processes", OPENRELAY_LOG_LEVEL="WARNING")
    yield procs
    procs.stop()


@pytest.fixture
def browser(processes, monkeypatch):
    # Playwright's sync API runs an event loop on this thread; the ORM calls
    # the test makes between browser steps are still plain sync calls.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: apt-get update && apt-get install -y chromium"
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        # Reduced motion: no bar transitions, so each screenshot shows what the DOM says.
        context = chromium.new_context(
            viewport={"width": 1280, "height": 900}, accept_downloads=True, reduced_motion="reduce"
        )
        context.set_default_timeout(20_000)
        yield context.new_page()
        # The ORM calls made while Playwright's loop ran had connections of
        # their own (asgiref's Local is context-local there): close them, or
        # they keep the test database from being dropped.
        connections.close_all()
        context.close()
        chromium.close()


def shot(page, name):
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def sign_in(page, url):
    page.goto(url + "/")
    shot(page, "01-sign-in")
    page.fill("#id_username", "ada")
    page.fill("#id_password", PASSWORD)
    page.click("button:has-text('Sign in')")
    page.wait_for_url(url + "/")
    page.wait_for_selector("[data-live].open")  # the organization feed is connected


def text(page, selector):
    return page.locator(selector).first.inner_text()


@pytest.fixture
def shots(request):
    folder = Path(django_settings.DATA_DIR) / "screenshots" / request.node.name
    folder.mkdir(parents=True, exist_ok=True)

    def shot(page, name):
        page.screenshot(path=str(folder / f"{name}.png"), full_page=True)

    return shot


def catalog(sim, concurrency):
    model = Model.objects.create(name=MODEL)
    Deployment.objects.create(model=model, base_url=sim.base_url, max_concurrency=concurrency)
    Price.objects.create(model=model, input_per_mtok="0.20", cached_input_per_mtok="0.05", output_per_mtok="0.80")
    return model
