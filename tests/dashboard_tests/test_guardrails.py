"""The dashboard's guardrails: a max cost at create, pause and resume buttons, the pause banner."""

import pytest

from batches.models import Batch
from tests.dashboard_tests.conftest import chat_line, jsonl, page_html, post_upload
from tests.helpers import make_batch

pytestmark = pytest.mark.django_db


def test_new_batch_takes_a_max_cost(alice_client, alice, gemma):
    assert 'name="max_cost"' in page_html(alice_client.get("/batches/new"))
    response = post_upload(alice_client, jsonl(chat_line("a")), max_cost="7.25")
    assert response.status_code == 302
    batch = Batch.objects.get()
    assert batch.max_cost_nanos == 7_250_000_000
    assert "Spend cap: <strong>$7.25</strong>" in page_html(alice_client.get(f"/batches/{batch.public_id}"))


def test_new_batch_refuses_a_bad_max_cost_and_keeps_what_was_typed(alice_client, gemma):
    response = post_upload(alice_client, jsonl(chat_line("a")), max_cost="-1")
    page = response.content.decode()
    assert response.status_code == 400 and "openrelay.max_cost" in page and 'value="-1"' in page
    assert not Batch.objects.exists()


def test_pause_shows_the_banner_and_resume_with_a_new_cap(alice_client, alice):
    batch = make_batch(alice.org, status="in_progress")
    page = page_html(alice_client.get(f"/batches/{batch.public_id}"))
    assert 'data-role="pause"' in page and "data-paused hidden" in page
    page = page_html(alice_client.post(f"/batches/{batch.public_id}/pause", follow=True))
    assert "Paused " in page and "Paused by its owner." in page
    assert 'data-role="resume" class="inline-form">' in page  # shown, not hidden
    batch.refresh_from_db()
    assert batch.paused_at is not None and batch.pause_reason == "requested"
    page = page_html(alice_client.post(f"/batches/{batch.public_id}/resume", {"max_cost": "3"}, follow=True))
    assert "Resumed" in page
    batch.refresh_from_db()
    assert batch.paused_at is None and batch.max_cost_nanos == 3 * 10**9
    listed = page_html(alice_client.get("/"))
    assert batch.public_id in listed


def test_pause_refused_for_a_finished_batch_and_another_organizations(alice_client, alice, bob):
    done = make_batch(alice.org, status="completed", completed=3)
    page = page_html(alice_client.post(f"/batches/{done.public_id}/pause", follow=True))
    assert "Cannot pause a batch with status" in page
    theirs = make_batch(bob.org, status="in_progress")
    assert alice_client.post(f"/batches/{theirs.public_id}/pause").status_code == 404
    theirs.refresh_from_db()
    assert theirs.paused_at is None
