"""The New batch page quotes before it creates: method and confidence beside every figure."""

from batches.models import Batch
from files.models import File
from tests.dashboard_tests.conftest import chat_line, jsonl, page_html, post_upload
from tests.helpers import CHAT, stored_file


def test_a_dropped_file_is_quoted_kept_and_chosen_for_create(alice_client, alice, gemma):
    response = post_upload(alice_client, jsonl(chat_line("a"), chat_line("b"), b"{broken"), action="quote")
    page = page_html(response)

    assert not Batch.objects.exists()
    file = File.objects.get()
    assert f'<option value="{file.public_id}" selected>' in page
    quote = page.split("data-quote ")[1].split("</section>")[0]
    for text in ("2 accepted, 1 rejected", "approximation", "confidence low", "Fits the 24h window"):
        assert text in quote, text
    assert "data-quote-note" in page  # no tokenizer, no history: said, not hidden
    assert page.index("data-quote ") < page.index("data-submit")  # the quote comes before Create

    created = post_upload(alice_client, None, input_file_id=file.public_id)
    assert created.status_code == 302 and Batch.objects.get().total_count == 2


def test_a_file_uploaded_before_is_quoted(alice_client, alice, gemma):
    file = stored_file(alice.org, jsonl(chat_line("a")))
    page = page_html(post_upload(alice_client, None, input_file_id=file.public_id, action="quote"))
    assert "1 accepted, 0 rejected" in page and not Batch.objects.exists()


def test_a_bad_input_is_refused_as_create_refuses_it(alice_client, alice, bob, gemma):
    theirs = stored_file(bob.org, jsonl(chat_line("a")))
    response = post_upload(alice_client, None, input_file_id=theirs.public_id, action="quote")
    assert response.status_code == 400 and "Cannot find file" in response.content.decode()
    assert "data-quote " not in response.content.decode()


def test_quotes_share_the_organizations_rate_with_the_api(alice_client, alice, bob_user, bob, gemma, settings):
    from django.test import Client

    settings.OPENRELAY_BATCH_ESTIMATE_RATE = "3/minute"
    file = stored_file(alice.org, jsonl(chat_line("a")))
    for _ in range(2):
        page_html(post_upload(alice_client, None, input_file_id=file.public_id, action="quote"))
    api = alice.client.post(
        "/v1/batches/estimate",
        {"endpoint": CHAT, "completion_window": "24h", "input_file_id": file.public_id},
        format="json",
    )
    assert api.status_code == 200
    response = post_upload(alice_client, None, input_file_id=file.public_id, action="quote")

    assert response.status_code == 429 and 1 <= int(response["Retry-After"]) <= 60
    page = response.content.decode()
    assert "Rate limit reached" in page and "data-quote " not in page
    bob_client = Client()
    bob_client.force_login(bob_user)
    theirs = stored_file(bob.org, jsonl(chat_line("a")))
    assert "data-quote " in page_html(post_upload(bob_client, None, input_file_id=theirs.public_id, action="quote"))
