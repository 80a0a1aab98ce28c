from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from openrelay.core.auth import authenticate_key
from openrelay.core.models import Organization


@pytest.mark.django_db
def test_create_org_prints_a_working_key_last():
    out = StringIO()
    call_command("create_org", "acme", "--workflows", stdout=out)
    key = out.getvalue().strip().splitlines()[-1]
    assert key.startswith("or_")
    found = authenticate_key(key)
    assert found.organization.name == "acme"
    assert Organization.objects.get(name="acme").workflows_enabled


@pytest.mark.django_db
def test_create_org_sets_a_concurrency_cap():
    call_command("create_org", "capped", "--max-concurrency", "8", stdout=StringIO())
    call_command("create_org", "free", stdout=StringIO())
    assert Organization.objects.get(name="capped").max_concurrency == 8
    assert Organization.objects.get(name="free").max_concurrency == 0
    with pytest.raises(CommandError, match="--max-concurrency"):
        call_command("create_org", "negative", "--max-concurrency", "-1", stdout=StringIO())
    assert not Organization.objects.filter(name="negative").exists()


@pytest.mark.django_db
def test_create_api_key_for_existing_org():
    call_command("create_org", "acme", stdout=StringIO())
    out = StringIO()
    call_command("create_api_key", "acme", stdout=out)
    key = out.getvalue().strip().splitlines()[-1]
    assert authenticate_key(key).organization.name == "acme"
    with pytest.raises(CommandError):
        call_command("create_api_key", "nobody", stdout=StringIO())
    with pytest.raises(CommandError):
        call_command("create_org", "acme", stdout=StringIO())


@pytest.mark.django_db
def test_admin_shows_new_key_once(admin_user, client):
    org = Organization.objects.create(name="acme")
    client.force_login(admin_user)
    response = client.post("/admin/openrelay/apikey/add/", {"organization": org.pk, "name": "ci"}, follow=True)
    assert response.status_code == 200
    page = response.content.decode()
    assert "shown once" in page
    key = page.split("copy it now): ")[1].split("<")[0].strip()
    assert authenticate_key(key) is not None
    listing = client.get("/admin/openrelay/apikey/").content.decode()
    assert key not in listing
