"""Dashboard pages: sign-in, organization scoping, new batch, cancel, files, downloads."""

import re
from datetime import timedelta

from django.test import Client

from batches.models import Batch
from files.models import File
from openrelay.core.models import Membership
from tests.dashboard_tests.conftest import PASSWORD, chat_line, jsonl, make_member, page_html, post_upload
from tests.helpers import make_batch, stored_file

SECRET = "Bearer sk-do-not-show-me"


# ---------------------------------------------------------------------------
# Sign-in


def test_it_shows_the_sign_in_form_at_home_to_visitors(client, db):
    page = page_html(client.get("/"))
    assert 'name="username"' in page and 'name="password"' in page
    assert "Batches" not in page.split("<main>")[1]


def test_it_signs_in_and_out(client, alice, alice_user):
    make_batch(alice.org, total=3, completed=1)
    refused = client.post("/", {"username": "alice", "password": "wrong"})
    assert refused.status_code == 200 and "Please enter a correct username and password" in refused.content.decode()
    response = client.post("/", {"username": "alice", "password": PASSWORD})
    assert response.status_code == 302 and response["Location"] == "/"
    page = page_html(client.get("/"))
    assert "alice-org" in page and 'data-socket="/ws/batches"' in page
    assert client.post("/logout").status_code == 302
    assert 'name="password"' in page_html(client.get("/"))


def test_it_returns_to_the_page_asked_for_after_sign_in(client, alice_user):
    response = client.get("/files")
    assert response.status_code == 302 and response["Location"] == "/login?next=/files"
    response = client.post("/login?next=/files", {"username": "alice", "password": PASSWORD, "next": "/files"})
    assert response["Location"] == "/files"


def test_it_refuses_a_user_without_an_organization(client, django_user_model):
    django_user_model.objects.create_user("drifter", password=PASSWORD)
    page = page_html(client.post("/", {"username": "drifter", "password": PASSWORD}))
    assert "belongs to no organization" in page
    assert "_auth_user_id" not in client.session


def test_it_answers_403_once_a_member_loses_the_organization(alice_client, alice_user):
    Membership.objects.filter(user=alice_user).delete()
    assert alice_client.get("/files").status_code == 403


def test_static_files_are_served_by_whitenoise(client, db):
    response = client.get("/static/dashboard/dashboard.js")
    assert response.status_code == 200
    assert b"batch.updated" in b"".join(response.streaming_content)


# ---------------------------------------------------------------------------
# Scoping


def test_another_organizations_ids_are_404(alice_client, bob):
    batch = make_batch(bob.org, status="in_progress")
    file = batch.input_file
    assert alice_client.get(f"/batches/{batch.public_id}").status_code == 404
    assert alice_client.post(f"/batches/{batch.public_id}/cancel").status_code == 404
    assert alice_client.get(f"/batches/{batch.public_id}/rejections.jsonl").status_code == 404
    assert alice_client.get(f"/files/{file.public_id}/download").status_code == 404
    assert alice_client.post(f"/files/{file.public_id}/delete").status_code == 404
    assert alice_client.get(f"/batches/new?file={file.public_id}").content.decode().count(file.public_id) == 0
    batch.refresh_from_db()
    assert batch.status == "in_progress" and File.objects.filter(pk=file.pk).exists()


def test_lists_show_only_the_organizations_own_rows(alice_client, alice, bob):
    mine, theirs = make_batch(alice.org), make_batch(bob.org)
    page = page_html(alice_client.get("/"))
    assert mine.public_id in page and theirs.public_id not in page
    files = page_html(alice_client.get("/files"))
    assert mine.input_file.public_id in files and theirs.input_file.public_id not in files


def test_the_batches_page_costs_the_same_queries_for_any_number_of_batches(
    alice_client, alice, django_assert_max_num_queries
):
    make_batch(alice.org)
    with django_assert_max_num_queries(6) as few:
        alice_client.get("/")
    for _ in range(12):
        make_batch(alice.org, status="completed", completed=10)
    with django_assert_max_num_queries(len(few.captured_queries)):
        page = page_html(alice_client.get("/"))
    assert page.count("data-batch=") == 13 + 1  # + the row template for batches created later


def test_the_batches_page_pages_by_cursor(alice_client, alice, settings, monkeypatch):
    monkeypatch.setattr("batches.dashboard.views.PAGE_SIZE", 2)
    batches = [make_batch(alice.org) for _ in range(3)]
    first = page_html(alice_client.get("/"))
    assert batches[2].public_id in first and batches[0].public_id not in first
    older = re.search(r'href="\?after=([^"]+)"', first).group(1)
    second = page_html(alice_client.get(f"/?after={older}"))
    assert batches[0].public_id in second and "data-insert-new" not in second


# ---------------------------------------------------------------------------
# Batch page


def test_the_batch_page_shows_timeline_counts_usage_and_files(alice_client, alice):
    output = stored_file(alice.org, b'{"custom_id": "a"}\n', filename="out.jsonl", purpose="batch_output")
    batch = make_batch(
        alice.org,
        status="completed",
        total=4,
        completed=3,
        failed=1,
        output_file=output,
        input_tokens=1200,
        output_tokens=34,
        cached_tokens=0,
    )
    Batch.objects.filter(pk=batch.pk).update(finalizing_at=batch.created_at, completed_at=batch.created_at)
    page = page_html(alice_client.get(f"/batches/{batch.public_id}"))
    assert "4 / 4" in page and "1,234" in page and "100%" in page
    assert re.search(
        r'data-ts="completed_at">\s*<span class="step">Completed</span> <time data-field="completed_at">20', page
    )
    assert f"/files/{output.public_id}/download" in page
    assert f"/files/{batch.input_file.public_id}/download" in page
    assert 'data-role="cancel"' not in page  # a completed batch can't be cancelled
    assert f'data-socket="/ws/batches/{batch.public_id}"' in page


def test_the_batch_page_shows_the_time_to_first_result_and_to_complete(alice_client, alice):
    batch = make_batch(alice.org, status="completed", total=4, completed=4)
    Batch.objects.filter(pk=batch.pk).update(
        first_result_at=batch.created_at + timedelta(seconds=7),
        finalizing_at=batch.created_at + timedelta(seconds=200),
        completed_at=batch.created_at + timedelta(seconds=200),
    )
    page = page_html(alice_client.get(f"/batches/{batch.public_id}"))
    assert '<span class="value" data-field="first_result">7 s</span>' in page
    assert '<span class="value" data-field="time_to_complete">3 min 20 s</span>' in page


def test_the_batch_page_shows_the_cached_share_of_input_tokens(alice_client, alice):
    batch = make_batch(
        alice.org, status="in_progress", total=4, completed=2, input_tokens=7290, output_tokens=40, cached_tokens=7090
    )
    page = page_html(alice_client.get(f"/batches/{batch.public_id}"))
    assert re.search(r'data-field="cached_share">97\.3%<', page)
    fresh = make_batch(alice.org, status="in_progress", total=4)
    assert re.search(r'data-field="cached_share">\u2014<', page_html(alice_client.get(f"/batches/{fresh.public_id}")))


def test_cancel_calls_the_cancel_service(alice_client, alice):
    batch = make_batch(alice.org, status="in_progress")
    response = alice_client.post(f"/batches/{batch.public_id}/cancel", follow=True)
    batch.refresh_from_db()
    assert batch.status == "cancelling" and batch.cancelling_at is not None
    assert "Cancelling" in response.content.decode()
    done = make_batch(alice.org, status="completed", completed=10)
    response = alice_client.post(f"/batches/{done.public_id}/cancel", follow=True)
    assert "Cannot cancel a batch with status &#x27;completed&#x27;" in response.content.decode()


# ---------------------------------------------------------------------------
# New batch


def test_it_uploads_creates_and_shows_the_rejected_records_right_away(alice_client, alice, gemma):
    secret_tool = chat_line("with-tools")
    secret_tool["body"]["openrelay"] = {"tool_config": {"url": "https://tools.example.com", "authorization": SECRET}}
    content = jsonl(
        chat_line("ok-1"),
        secret_tool,
        b'{"custom_id": "broken", ',
        chat_line("ok-1"),  # duplicate custom_id
        {
            **chat_line("unknown-model"),
            "body": {"model": "nope/unknown", "messages": [{"role": "user", "content": "x"}]},
        },
    )
    response = post_upload(alice_client, content, priority="expedited")
    assert response.status_code == 302
    batch = Batch.objects.get(organization=alice.org)
    assert response["Location"] == f"/batches/{batch.public_id}?created=1"
    assert (batch.total_count, batch.priority, batch.endpoint) == (2, "expedited", "/v1/chat/completions")
    page = page_html(alice_client.get(response["Location"]))
    assert "Batch created: 2 records accepted, 3 rejected" in page
    rejected = page.split("data-rejections")[1]
    for line in ('<td class="num">3</td>', '<td class="num">4</td>', '<td class="num">5</td>'):
        assert line in rejected
    assert "duplicate" in rejected.lower()
    # The input is never echoed: not the secret, not the raw lines.
    for url in (response["Location"], "/", "/files"):
        assert "sk-do-not-show-me" not in page_html(alice_client.get(url))
    download = alice_client.get(f"/batches/{batch.public_id}/rejections.jsonl")
    assert download.status_code == 200 and len(download.content.splitlines()) == 3


def test_a_batch_whose_every_record_is_rejected_is_failed(alice_client, alice, gemma):
    response = post_upload(
        alice_client, jsonl({"custom_id": "x", "method": "POST", "url": "/v1/embeddings", "body": {}})
    )
    batch = Batch.objects.get(organization=alice.org)
    page = page_html(alice_client.get(response["Location"]))
    assert batch.status == "failed" and "0 records accepted, 1 rejected" in page


def test_it_refuses_a_file_that_is_not_jsonl_and_keeps_nothing(alice_client, alice, gemma):
    response = post_upload(alice_client, b"\x00\x01binary")
    assert response.status_code == 400
    assert "Invalid file format for Batch API" in response.content.decode()
    assert not File.objects.exists() and not Batch.objects.exists()


def test_it_deletes_the_upload_when_the_create_is_refused(alice_client, alice, gemma):
    response = post_upload(alice_client, jsonl(chat_line("a")), endpoint="/v1/images")
    assert response.status_code == 400 and "Invalid value for &#x27;endpoint&#x27;" in response.content.decode()
    assert not File.objects.exists()


def test_it_asks_for_a_file(alice_client, gemma):
    response = post_upload(alice_client, None)
    assert response.status_code == 400 and "Choose or drop a JSONL file" in response.content.decode()


def test_it_creates_a_batch_from_a_file_uploaded_before(alice_client, alice, gemma):
    file = stored_file(alice.org, jsonl(chat_line("a"), chat_line("b")))
    assert file.public_id in page_html(alice_client.get(f"/batches/new?file={file.public_id}"))
    response = post_upload(alice_client, None, input_file_id=file.public_id)
    batch = Batch.objects.get()
    assert response["Location"].startswith(f"/batches/{batch.public_id}")
    assert batch.input_file == file and batch.total_count == 2


def test_it_cannot_use_another_organizations_file(alice_client, bob, gemma):
    file = stored_file(bob.org, jsonl(chat_line("a")))
    response = post_upload(alice_client, None, input_file_id=file.public_id)
    assert response.status_code == 400 and "Cannot find file" in response.content.decode()
    assert not Batch.objects.exists()


def test_new_batch_checks_the_csrf_token_after_the_capped_upload(alice_user, gemma):
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice_user)
    assert post_upload(client, jsonl(chat_line("a"))).status_code == 403
    assert not File.objects.exists() and not Batch.objects.exists()
    page = page_html(client.get("/batches/new"))
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    assert post_upload(client, jsonl(chat_line("a")), csrfmiddlewaretoken=token).status_code == 302


def test_new_batch_refuses_an_upload_over_the_cap(alice_client, settings, gemma):
    settings.OPENRELAY_MAX_UPLOAD_BYTES = 100
    response = post_upload(alice_client, jsonl(*[chat_line(f"r{i}") for i in range(5)]))
    assert response.status_code == 413 and "File is too large" in response.content.decode()
    assert not File.objects.exists()


# ---------------------------------------------------------------------------
# Files


def test_files_are_listed_downloaded_and_deleted(alice_client, alice):
    file = stored_file(alice.org, b'{"custom_id": "a"}\n', filename="mine.jsonl")
    page = page_html(alice_client.get("/files"))
    assert "mine.jsonl" in page and f"/files/{file.public_id}/delete" in page
    download = alice_client.get(f"/files/{file.public_id}/download")
    assert download.status_code == 200
    assert b"".join(download.streaming_content) == b'{"custom_id": "a"}\n'
    assert 'filename="mine.jsonl"' in download["Content-Disposition"]
    response = alice_client.post(f"/files/{file.public_id}/delete", follow=True)
    assert "Deleted mine.jsonl" in response.content.decode()
    assert not File.objects.filter(pk=file.pk).exists()
    assert alice_client.get(f"/files/{file.public_id}/download").status_code == 404


def test_a_file_read_by_a_running_batch_is_not_deleted(alice_client, alice):
    batch = make_batch(alice.org)
    File.objects.filter(pk=batch.input_file_id).update(pins=1)
    response = alice_client.post(f"/files/{batch.input_file.public_id}/delete", follow=True)
    assert "can&#x27;t be deleted yet" in response.content.decode()
    assert File.objects.filter(pk=batch.input_file_id).exists()


def test_files_delete_needs_a_post(alice_client, alice):
    file = stored_file(alice.org)
    assert alice_client.get(f"/files/{file.public_id}/delete").status_code == 405
    assert File.objects.filter(pk=file.pk).exists()


def test_members_of_one_organization_share_its_pages(client, alice, django_user_model):
    batch = make_batch(alice.org)
    carol = make_member(django_user_model, "carol", alice.org)
    client.force_login(carol)
    assert batch.public_id in page_html(client.get("/"))
