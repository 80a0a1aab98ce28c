"""Idempotency-Key on POST /v1/batches: the same key and body give the first batch again, another body
is 409 idempotency_key_reused, keys belong to an organization and last 24 h (openrelay.core.idempotency)."""

from datetime import timedelta

import orjson
import pytest

from batches.models import Batch
from openrelay.core import idempotency
from openrelay.core.models import IdempotencyKey
from tests.batches_api_tests.helpers import CHAT, chat_line, create, error_of, jsonl, upload


def create_with_key(persona, key, **params):
    body = {"endpoint": CHAT, "completion_window": "24h", **params}
    return persona.client.post("/v1/batches", body, format="json", HTTP_IDEMPOTENCY_KEY=key)


@pytest.mark.django_db
class TestIdempotentCreate:
    def test_it_answers_the_first_batch_again_for_the_same_key_and_body(self, alice, gemma):
        file = upload(alice, jsonl(chat_line("a"), chat_line("b")))
        first = create_with_key(alice, "retry-1", input_file_id=file.public_id, metadata={"a": "1", "b": "2"})
        # The same body with its keys in another order is the same request.
        again = create_with_key(alice, "retry-1", metadata={"b": "2", "a": "1"}, input_file_id=file.public_id)
        assert first.status_code == again.status_code == 200, again.content
        assert again.json()["id"] == first.json()["id"]
        assert Batch.objects.count() == 1
        assert create(alice, input_file_id=file.public_id).json()["id"] != first.json()["id"]  # no key: a new one

    def test_the_same_key_with_another_body_is_409(self, alice, gemma):
        file = upload(alice, jsonl(chat_line("a")))
        assert create_with_key(alice, "k", input_file_id=file.public_id).status_code == 200
        error = error_of(create_with_key(alice, "k", input_file_id=file.public_id, metadata={"x": "y"}), 409)
        assert error["code"] == "idempotency_key_reused" and error["param"] == "Idempotency-Key"
        assert Batch.objects.count() == 1

    def test_keys_belong_to_one_organization(self, alice, bob, gemma):
        mine, theirs = upload(alice, jsonl(chat_line("a"))), upload(bob, jsonl(chat_line("a")))
        a = create_with_key(alice, "shared-name", input_file_id=mine.public_id)
        b = create_with_key(bob, "shared-name", input_file_id=theirs.public_id)
        assert a.status_code == b.status_code == 200 and a.json()["id"] != b.json()["id"]

    def test_a_refused_create_lets_its_key_go(self, alice, gemma):
        file = upload(alice, jsonl(chat_line("a")))
        assert error_of(create_with_key(alice, "k", input_file_id="file-missing"), 400)["code"]
        assert create_with_key(alice, "k", input_file_id=file.public_id).status_code == 200

    def test_a_duplicate_while_the_first_runs_is_409_in_use_and_creates_nothing(self, alice, gemma):
        file = upload(alice, jsonl(chat_line("a")))
        body = {"endpoint": CHAT, "completion_window": "24h", "input_file_id": file.public_id}
        # The first request's row, inserted before its create runs: the unique constraint stops the second.
        idempotency._claim(
            alice.org, "batches", "k", idempotency.fingerprint(orjson.dumps(body, option=orjson.OPT_SORT_KEYS))
        )
        error = error_of(create_with_key(alice, "k", input_file_id=file.public_id), 409)
        assert error["code"] == "idempotency_key_in_use"
        assert Batch.objects.count() == 0

    def test_a_key_is_kept_24_hours(self, alice, gemma):
        file = upload(alice, jsonl(chat_line("a")))
        first = create_with_key(alice, "k", input_file_id=file.public_id).json()["id"]
        IdempotencyKey.objects.update(
            created_at=IdempotencyKey.objects.get().created_at - timedelta(hours=24, seconds=1)
        )
        again = create_with_key(alice, "k", input_file_id=file.public_id)
        assert again.status_code == 200 and again.json()["id"] != first
        assert IdempotencyKey.objects.count() == 1  # the expired one is gone

    def test_an_empty_or_long_key_is_400(self, alice, gemma):
        for key in ("", "k" * 256):
            assert error_of(create_with_key(alice, key, input_file_id="file-x"))["code"] == "invalid_idempotency_key"
