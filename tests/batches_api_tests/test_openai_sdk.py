"""The real openai SDK against a live server: create, retrieve, list (auto-paging), cancel, errors."""

import openai
import pytest
from django.core.signals import request_started

from batches.models import Batch, BatchStatus
from tests.batches_api_tests.helpers import CHAT, GEMMA, chat_line, jsonl, upload


@pytest.fixture
def sdk(live_server, alice):
    return openai.OpenAI(api_key=alice.key, base_url=f"{live_server.url}/v1")


@pytest.fixture
def requests_seen():
    """Paths of every request the server receives (counts SDK retries server-side)."""
    seen = []

    def record(sender, environ, **kwargs):
        seen.append((environ["REQUEST_METHOD"], environ["PATH_INFO"]))

    request_started.connect(record)
    yield seen
    request_started.disconnect(record)


@pytest.mark.django_db(transaction=True)
class TestOpenAISdk:
    def test_it_creates_and_retrieves(self, sdk, alice, gemma):
        file = upload(alice, jsonl(chat_line("a"), chat_line("b"), "{broken"))
        batch = sdk.batches.create(
            input_file_id=file.public_id, endpoint=CHAT, completion_window="24h", metadata={"job": "nightly"}
        )
        assert batch.id.startswith("batch_")
        assert batch.status == "validating"
        assert batch.model == GEMMA
        assert batch.request_counts.total == 2
        assert batch.metadata == {"job": "nightly"}
        assert batch.errors.data[0].code == "invalid_json_line"
        assert batch.errors.data[0].line == 3
        assert batch.model_extra["priority"] == "standard"
        again = sdk.batches.retrieve(batch.id)
        assert again.id == batch.id and again.input_file_id == file.public_id
        assert again.usage is None

    def test_it_sends_inline_requests_through_extra_body(self, sdk, gemma):
        batch = sdk.batches.create(
            input_file_id=None,
            endpoint=CHAT,
            completion_window="24h",
            extra_body={"requests": [chat_line("a")], "priority": "expedited"},
        )
        assert batch.request_counts.total == 1
        assert batch.input_file_id.startswith("file-")
        assert batch.model_extra["priority"] == "expedited"

    def test_it_auto_pages_the_list(self, sdk, alice, bob, gemma, requests_seen):
        created = [
            sdk.batches.create(
                input_file_id=upload(alice, jsonl(chat_line("a"))).public_id, endpoint=CHAT, completion_window="24h"
            ).id
            for _ in range(5)
        ]
        upload(bob, jsonl(chat_line("a")))
        del requests_seen[:]
        listed = [batch.id for batch in sdk.batches.list(limit=2)]
        assert listed == created[::-1]
        assert len([p for m, p in requests_seen if p == "/v1/batches"]) == 3  # 2 + 2 + 1

    def test_it_cancels(self, sdk, alice, gemma):
        file = upload(alice, jsonl(chat_line("a")))
        batch = sdk.batches.create(input_file_id=file.public_id, endpoint=CHAT, completion_window="24h")
        cancelled = sdk.batches.cancel(batch.id)
        assert cancelled.status == "cancelling"
        assert cancelled.cancelling_at is not None
        assert sdk.batches.cancel(batch.id).status == "cancelling"

    def test_it_gets_a_final_409_without_retries(self, sdk, alice, gemma, requests_seen):
        file = upload(alice, jsonl(chat_line("a")))
        batch = sdk.batches.create(input_file_id=file.public_id, endpoint=CHAT, completion_window="24h")
        Batch.objects.filter(public_id=batch.id).update(status=BatchStatus.COMPLETED)
        del requests_seen[:]
        with pytest.raises(openai.ConflictError) as caught:
            sdk.batches.cancel(batch.id)  # default max_retries=2: 409s are retried unless told not to
        assert caught.value.body["message"] == "Cannot cancel a batch with status 'completed'."
        assert requests_seen == [("POST", f"/v1/batches/{batch.id}/cancel")]

    def test_it_maps_errors_to_sdk_exceptions(self, sdk, bob, alice, gemma):
        file = upload(alice, jsonl(chat_line("a")))
        with pytest.raises(openai.BadRequestError) as caught:
            sdk.batches.create(input_file_id=file.public_id, endpoint="/v1/invalid/endpoint", completion_window="24h")
        assert (caught.value.param, caught.value.code) == ("endpoint", "invalid_value")
        with pytest.raises(openai.NotFoundError):
            sdk.batches.retrieve("batch_nope")
        bob_sdk = openai.OpenAI(api_key=bob.key, base_url=str(sdk.base_url))
        with pytest.raises(openai.BadRequestError) as caught:
            bob_sdk.batches.create(input_file_id=file.public_id, endpoint=CHAT, completion_window="24h")
        assert caught.value.param == "input_file_id"
        batch = sdk.batches.create(input_file_id=file.public_id, endpoint=CHAT, completion_window="24h")
        with pytest.raises(openai.NotFoundError):
            bob_sdk.batches.cancel(batch.id)
        assert list(bob_sdk.batches.list()) == []
