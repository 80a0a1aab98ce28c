import pytest

from batches.models import Batch, BatchStatus
from files import services as file_services


@pytest.fixture(autouse=True)
def _storage(settings, tmp_path):
    settings.STORAGES = {**settings.STORAGES, "default": {
        "BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path)}}}


@pytest.mark.django_db
def test_it_lists_and_shows_batches_and_files_and_cancels(admin_user, client, alice, django_capture_on_commit_callbacks):
    from django.utils import timezone

    file = file_services.create_file_from_chunks(organization=alice.org, filename="in.jsonl", purpose="batch",
                                                 chunks=[b'{"a": 1}\n'])
    batch = Batch.objects.create(organization=alice.org, endpoint="/v1/chat/completions", input_file=file,
                                 input_file_public_id=file.public_id, expires_at=timezone.now(),
                                 status=BatchStatus.IN_PROGRESS)
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
