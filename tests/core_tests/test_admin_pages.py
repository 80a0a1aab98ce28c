import pytest

from batches.models import Batch, BatchStatus
from files import services as file_services

pytestmark = pytest.mark.usefixtures("tmp_storage")  # stored files in tmp_path (tests/fixtures/storage.py)


@pytest.mark.django_db
def test_it_lists_and_shows_batches_and_files_and_cancels(
    admin_user, client, alice, django_capture_on_commit_callbacks
):
    from django.utils import timezone

    file = file_services.create_file_from_chunks(
        organization=alice.org, filename="in.jsonl", purpose="batch", chunks=[b'{"a": 1}\n']
    )
    batch = Batch.objects.create(
        organization=alice.org,
        endpoint="/v1/chat/completions",
        input_file=file,
        input_file_public_id=file.public_id,
        expires_at=timezone.now(),
        status=BatchStatus.IN_PROGRESS,
    )
    client.force_login(admin_user)
    assert batch.public_id in client.get("/admin/batches/batch/").content.decode()
    assert client.get(f"/admin/batches/batch/{batch.pk}/change/").status_code == 200
    assert file.public_id in client.get("/admin/files/file/").content.decode()
    assert client.get(f"/admin/files/file/{file.pk}/change/").status_code == 200
    with django_capture_on_commit_callbacks(execute=False):
        client.post("/admin/batches/batch/", {"action": "cancel", "_selected_action": [batch.pk]})
    batch.refresh_from_db()
    assert batch.status == BatchStatus.CANCELLING and batch.cancelling_at


@pytest.mark.django_db
def test_it_refuses_non_staff(client, alice):
    assert client.get("/admin/batches/batch/").status_code == 302


@pytest.mark.django_db
def test_the_deployment_pages_show_health_since_when_and_the_last_error_without_the_key(admin_user, client):
    from django.utils import timezone

    from openrelay.core.models import Deployment, Model

    model = Model.objects.create(name="m")
    since = timezone.now()
    deployment = Deployment.objects.create(
        model=model,
        base_url="http://127.0.0.1:9/v1",
        api_key="sk-upstream-secret",
        health="unhealthy",
        health_changed_at=since,
        last_error="HTTP 401: Invalid API key.",
    )
    client.force_login(admin_user)
    listing = client.get("/admin/openrelay/deployment/").content.decode()
    page = client.get(f"/admin/openrelay/deployment/{deployment.pk}/change/").content.decode()
    for html in (listing, page):
        assert "Unhealthy" in html and "HTTP 401: Invalid API key." in html
        assert "sk-upstream-secret" not in html
    assert client.get("/admin/openrelay/deployment/?health__exact=unhealthy").status_code == 200
    # The engines write these; the form does not offer them.
    assert 'name="health"' not in page and 'name="last_error"' not in page
