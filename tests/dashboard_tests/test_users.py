"""Dashboard users: `add_user` and the organization on the admin's user page."""

from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError

from openrelay.core.models import Membership

pytestmark = pytest.mark.django_db


def test_add_user_reads_the_password_from_the_environment(alice, monkeypatch, client):
    monkeypatch.setenv("OPENRELAY_USER_PASSWORD", "s3cret-enough")
    out = StringIO()
    call_command("add_user", "dora", "--org", "alice-org", stdout=out)
    assert "Created user dora in organization alice-org" in out.getvalue()
    user = get_user_model().objects.get(username="dora")
    assert user.membership.organization == alice.org and not user.is_staff
    assert client.post("/", {"username": "dora", "password": "s3cret-enough"}).status_code == 302


def test_add_user_prompts_for_the_password_and_makes_staff(alice, monkeypatch):
    monkeypatch.delenv("OPENRELAY_USER_PASSWORD", raising=False)
    answers = iter(["typed-password", "typed-password"])
    monkeypatch.setattr("getpass.getpass", lambda prompt="": next(answers))
    call_command("add_user", "erin", "--org", "alice-org", "--staff", stdout=StringIO())
    user = get_user_model().objects.get(username="erin")
    assert user.is_staff and user.is_superuser and user.check_password("typed-password")


def test_add_user_refuses_an_unknown_org_an_existing_user_and_mismatched_passwords(alice, monkeypatch):
    monkeypatch.setenv("OPENRELAY_USER_PASSWORD", "pw")
    with pytest.raises(CommandError, match="No organization named 'nope'"):
        call_command("add_user", "fred", "--org", "nope", stdout=StringIO())
    call_command("add_user", "fred", "--org", "alice-org", stdout=StringIO())
    with pytest.raises(CommandError, match="already exists"):
        call_command("add_user", "fred", "--org", "alice-org", stdout=StringIO())
    monkeypatch.delenv("OPENRELAY_USER_PASSWORD")
    answers = iter(["one", "two"])
    monkeypatch.setattr("getpass.getpass", lambda prompt="": next(answers))
    with pytest.raises(CommandError, match="do not match"):
        call_command("add_user", "gina", "--org", "alice-org", stdout=StringIO())
    assert not get_user_model().objects.filter(username__in=["gina"]).exists()
    assert Membership.objects.count() == 1


def test_the_admin_sets_a_users_organization(admin_user, alice, bob, client, django_user_model):
    user = django_user_model.objects.create_user("hank", password="pw")
    Membership.objects.create(user=user, organization=alice.org)
    client.force_login(admin_user)
    listing = client.get("/admin/auth/user/").content.decode()
    assert "alice-org" in listing
    page = client.get(f"/admin/auth/user/{user.pk}/change/").content.decode()
    assert "membership-0-organization" in page
    membership = Membership.objects.get(user=user)
    response = client.post(
        f"/admin/auth/user/{user.pk}/change/",
        {
            "username": "hank",
            "is_active": "on",
            "date_joined_0": "2026-01-01",
            "date_joined_1": "00:00:00",
            "membership-TOTAL_FORMS": "1",
            "membership-INITIAL_FORMS": "1",
            "membership-MIN_NUM_FORMS": "0",
            "membership-MAX_NUM_FORMS": "1",
            "membership-0-id": membership.pk,
            "membership-0-user": user.pk,
            "membership-0-organization": bob.org.pk,
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    membership.refresh_from_db()
    assert membership.organization == bob.org
