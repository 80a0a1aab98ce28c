"""Isolation: every route, called with another organization's ids and keys, is refused.

Bob (his own organization, a valid key) aims every API route at Alice's
files and batches: each answer is a 404 (or a coded 400 where the id is a
parameter), says nothing of Alice's objects, and changes nothing. Without a
valid key every route is a 401. Dashboard pages are covered the same way
when the dashboard is installed.
"""

import orjson
import pytest
from django.urls import NoReverseMatch, reverse

from batches.models import Batch
from files import services as file_services
from files.models import File
from openrelay.core.models import ApiKey
from tests.reliability_tests.conftest import assert_envelope, jsonl, record, upload

SECRET_FILENAME = "alice-private-input.jsonl"


@pytest.fixture
def alices(alice, catalog):
    """Alice's input file, a batch on it, and a finished batch's output file."""
    file_id = upload(alice.client, jsonl(record("a1"), record("a2")), filename=SECRET_FILENAME).json()["id"]
    response = alice.client.post(
        "/v1/batches",
        {
            "input_file_id": file_id,
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
            "metadata": {"owner": "alice"},
        },
        format="json",
    )
    assert response.status_code == 200, response.content
    batch_id = response.json()["id"]
    output = file_services.create_file_from_chunks(
        organization=alice.org, filename="alice-output.jsonl", purpose="batch_output", chunks=[b'{"x": 1}\n']
    )
    Batch.objects.filter(public_id=batch_id).update(output_file=output)
    return {"file": file_id, "batch": batch_id, "output": output.public_id}


# (name, method, path template, body) -- {file}, {batch}, {output} are Alice's ids.
API_ROUTES = [
    ("file retrieve", "get", "/v1/files/{file}", None),
    ("file content", "get", "/v1/files/{file}/content", None),
    ("file delete", "delete", "/v1/files/{file}", None),
    ("output retrieve", "get", "/v1/files/{output}", None),
    ("output content", "get", "/v1/files/{output}/content", None),
    ("output delete", "delete", "/v1/files/{output}", None),
    ("batch retrieve", "get", "/v1/batches/{batch}", None),
    ("batch cancel", "post", "/v1/batches/{batch}/cancel", None),
    ("batch retry", "post", "/v1/batches/{batch}/retry", None),
    ("batch results", "get", "/v1/batches/{batch}/results", None),
]
# Routes that take the id as a parameter: refused with a coded 400.
PARAM_ROUTES = [
    (
        "create from her file",
        "post",
        "/v1/batches",
        {"input_file_id": "{file}", "endpoint": "/v1/chat/completions", "completion_window": "24h"},
        400,
        "file_not_found",
    ),
    (
        "create from her output",
        "post",
        "/v1/batches",
        {"input_file_id": "{output}", "endpoint": "/v1/chat/completions", "completion_window": "24h"},
        400,
        "file_not_found",
    ),
    # A cursor naming another organization's object is not found, as the object itself is.
    ("batch list after hers", "get", "/v1/batches?after={batch}", None, 404, "not_found"),
    ("file list after hers", "get", "/v1/files?after={file}", None, 404, "not_found"),
]


def _fill(template, ids):
    if template is None:
        return None
    text = orjson.dumps(template).decode() if not isinstance(template, str) else template
    for name, value in ids.items():
        text = text.replace("{" + name + "}", value)
    return text if isinstance(template, str) else orjson.loads(text)


def _call(client, method, path, body):
    if body is None:
        return getattr(client, method)(path)
    return getattr(client, method)(path, body, format="json")


def _alice_is_untouched(alice, ids):
    assert File.objects.filter(public_id=ids["file"], organization=alice.org).exists()
    assert File.objects.filter(public_id=ids["output"], organization=alice.org).exists()
    batch = Batch.objects.get(public_id=ids["batch"])
    assert batch.status == "validating" and batch.organization_id == alice.org.pk
    assert alice.client.get(f"/v1/files/{ids['file']}/content").status_code == 200


def _reveals_nothing(response, ids):
    content = response.content
    assert SECRET_FILENAME.encode() not in content and b"alice" not in content.lower()


@pytest.mark.parametrize("name, method, path, body", API_ROUTES, ids=[r[0] for r in API_ROUTES])
def test_another_organizations_ids_are_not_found(alice, bob, alices, name, method, path, body):
    response = _call(bob.client, method, _fill(path, alices), _fill(body, alices))
    error = assert_envelope(response, 404)
    assert error["type"] == "not_found_error"
    _reveals_nothing(response, alices)
    _alice_is_untouched(alice, alices)


@pytest.mark.parametrize("name, method, path, body, status, code", PARAM_ROUTES, ids=[r[0] for r in PARAM_ROUTES])
def test_another_organizations_ids_as_parameters_are_refused(
    alice, bob, alices, name, method, path, body, status, code
):
    response = _call(bob.client, method, _fill(path, alices), _fill(body, alices))
    assert_envelope(response, status, code)
    _reveals_nothing(response, alices)
    _alice_is_untouched(alice, alices)
    assert not Batch.objects.filter(organization=bob.org).exists()


def test_lists_show_only_the_callers_objects(alice, bob, alices):
    for path in ("/v1/files", "/v1/batches", "/v1/files?purpose=batch_output"):
        response = bob.client.get(path)
        assert response.status_code == 200 and response.json()["data"] == [], path
    assert {f["id"] for f in alice.client.get("/v1/files").json()["data"]} == {alices["file"], alices["output"]}


def _usage_route():
    try:
        return reverse("organization-usage")
    except NoReverseMatch:
        return None


ALL_ROUTES = (
    [(m, p, b) for _, m, p, b in API_ROUTES]
    + [(m, p, b) for _, m, p, b, _, _ in PARAM_ROUTES]
    + [
        ("get", "/v1/files", None),
        ("get", "/v1/batches", None),
        ("post", "/v1/files", None),
        (
            "post",
            "/v1/batches",
            {"endpoint": "/v1/chat/completions", "completion_window": "24h", "requests": [record("x")]},
        ),
    ]
    + ([("get", _usage_route(), None)] if _usage_route() else [])
)


@pytest.mark.parametrize("credentials", ["none", "malformed", "unknown", "revoked", "wrong-scheme"])
def test_every_api_route_refuses_a_caller_without_a_valid_key(alice, alices, credentials):
    from rest_framework.test import APIClient

    client = APIClient()
    header = {
        "none": None,
        "malformed": "Bearer",
        "unknown": "Bearer or_" + "x" * 43,
        "revoked": f"Bearer {alice.key}",
        "wrong-scheme": f"Basic {alice.key}",
    }[credentials]
    if credentials == "revoked":
        ApiKey.objects.get(organization=alice.org).revoke()
    if header:
        client.credentials(HTTP_AUTHORIZATION=header)
    for method, path, body in ALL_ROUTES:
        response = _call(client, method, _fill(path, alices), _fill(body, alices))
        error = assert_envelope(response, 401)
        assert error["type"] == "authentication_error", (method, path)
        _reveals_nothing(response, alices)
    assert Batch.objects.count() == 1


def test_usage_shows_only_the_callers_organization(alice, bob, alices):
    path = _usage_route()
    if path is None:  # the usage endpoint is not installed: nothing to leak through
        assert _usage_route() is None
        return
    response = bob.client.get(path)
    assert response.status_code == 200, response.content
    _reveals_nothing(response, alices)
    assert alices["batch"].encode() not in response.content


# --- dashboard pages ---------------------------------------------------------------


def _dashboard_installed():
    try:
        reverse("dashboard:batch", args=["batch_x"])
        from openrelay.core.models import Membership  # noqa: F401
    except (NoReverseMatch, ImportError):
        return False
    return True


DASHBOARD_PAGES = (
    [
        ("get", "dashboard:batch", "batch"),
        ("post", "dashboard:batch-cancel", "batch"),
        ("get", "dashboard:batch-rejections", "batch"),
        ("get", "dashboard:file-download", "file"),
        ("get", "dashboard:file-download", "output"),
        ("post", "dashboard:file-delete", "file"),
        ("post", "dashboard:file-delete", "output"),
    ]
    if _dashboard_installed()
    else []
)


@pytest.fixture
def bob_signed_in(bob, django_user_model, client):
    from openrelay.core.models import Membership

    user = django_user_model.objects.create_user("bob-user", password="bob-password")
    Membership.objects.create(user=user, organization=bob.org)
    client.force_login(user)
    return client


# Defined only where the dashboard is installed (an empty parametrize would report a skip).
if DASHBOARD_PAGES:

    @pytest.mark.parametrize(
        "method, name, target", DASHBOARD_PAGES, ids=[f"{m} {n} {t}" for m, n, t in DASHBOARD_PAGES]
    )
    def test_dashboard_pages_refuse_another_organizations_ids(alice, alices, bob_signed_in, method, name, target):
        response = getattr(bob_signed_in, method)(reverse(name, args=[alices[target]]))
        assert response.status_code == 404, (name, response.status_code)
        _reveals_nothing(response, alices)
        _alice_is_untouched(alice, alices)

    @pytest.mark.parametrize(
        "method, name, target", DASHBOARD_PAGES, ids=[f"{m} {n} {t}" for m, n, t in DASHBOARD_PAGES]
    )
    def test_dashboard_pages_refuse_anonymous_visitors(alice, alices, client, method, name, target):
        response = getattr(client, method)(reverse(name, args=[alices[target]]))
        assert response.status_code in (302, 401, 403, 404), (name, response.status_code)
        if response.status_code == 302:
            assert "login" in response["Location"]
        _reveals_nothing(response, alices)
        _alice_is_untouched(alice, alices)


def test_the_admin_refuses_api_keys_and_non_staff(alice, alices, client, django_user_model):
    # An API key is not an admin login, and neither is a dashboard user.
    for path in ("/admin/", "/admin/openrelay/organization/", "/admin/openrelay/deployment/"):
        assert alice.client.get(path).status_code == 302
    user = django_user_model.objects.create_user("plain-user", password="pw")
    client.force_login(user)
    assert client.get("/admin/openrelay/organization/").status_code == 302


# --- websockets ----------------------------------------------------------------------


def _websocket_paths():
    from batches.dashboard.routing import websocket_urlpatterns

    return [str(p.pattern) for p in websocket_urlpatterns]


WEBSOCKETS = [("/ws/batches/{batch}", "feed of her batch")] if "ws/batches/<str:batch_id>" in _websocket_paths() else []


def _session_cookie(django_user_model, username, organization):
    from django.contrib.sessions.backends.db import SessionStore

    from openrelay.core.models import Membership

    user = django_user_model.objects.create_user(username, password="pw")
    Membership.objects.create(user=user, organization=organization)
    session = SessionStore()
    session["_auth_user_id"] = str(user.pk)
    session["_auth_user_backend"] = "django.contrib.auth.backends.ModelBackend"
    session["_auth_user_hash"] = user.get_session_auth_hash()
    session.save()
    return f"sessionid={session.session_key}".encode()


async def _connect(path, cookie):
    from channels.testing import WebsocketCommunicator

    from openrelay.asgi import application

    headers = [(b"origin", b"http://testserver"), (b"host", b"testserver")] + ([(b"cookie", cookie)] if cookie else [])
    communicator = WebsocketCommunicator(application, path, headers=headers)
    connected, code = await communicator.connect(timeout=5)
    await communicator.disconnect()
    return connected, code


if WEBSOCKETS:

    @pytest.mark.parametrize("path, what", WEBSOCKETS, ids=[w for _, w in WEBSOCKETS])
    def test_websockets_refuse_another_organizations_batch(
        alice, bob, alices, path, what, django_user_model, transactional_db
    ):
        import asyncio

        path = _fill(path, alices)
        bobs = _session_cookie(django_user_model, "bob-user", bob.org)
        alices_own = _session_cookie(django_user_model, "alice-user", alice.org)
        assert asyncio.run(_connect(path, alices_own))[0] is True  # the positive control
        connected, code = asyncio.run(_connect(path, bobs))
        assert connected is False and code == 4404
        connected, code = asyncio.run(_connect(path, None))
        assert connected is False and code in (4401, 4403)
