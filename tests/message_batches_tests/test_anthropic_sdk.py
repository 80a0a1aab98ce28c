"""The official anthropic SDK, unchanged, against the Message Batches dialect: create, retrieve,
list both ways, cancel, delete and results, with translated and pass-through deployments."""

import anthropic
import httpx
import orjson
import pytest
from anthropic.types.messages import MessageBatch, MessageBatchIndividualResponse
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone

from batches.engine.runner import run_batch
from batches.models import Batch, BatchStatus
from tests.helpers import read_lines
from tests.message_batches_tests.conftest import NATIVE, TRANSLATED, request

CHAT, MESSAGES = "/v1/chat/completions", "/v1/messages"


def batch_of(message_batch):
    return Batch.objects.get(public_id=message_batch.id.replace("msgbatch_", "batch_"))


def results_by_id(claude, message_batch_id):
    results = list(claude.messages.batches.results(message_batch_id))
    assert all(isinstance(r, MessageBatchIndividualResponse) for r in results)
    return {r.custom_id: r.result for r in results}


@pytest.mark.django_db(transaction=True)
class TestMessageBatches:
    def test_it_runs_a_batch_translated_to_chat_completions(self, claude, translated, native, sim):
        created = claude.messages.batches.create(
            requests=[
                request("a", "What is a batch?", system="Be brief."),
                request("b", "Stop early", stop_sequences=["###"]),
                request("other", model=NATIVE),  # a batch runs one model: refused by the record checks, not at create
            ]
        )
        assert isinstance(created, MessageBatch)
        assert created.id.startswith("msgbatch_") and created.type == "message_batch"
        assert created.processing_status == "in_progress"
        assert created.results_url is None and created.ended_at is None
        assert (created.expires_at - created.created_at).total_seconds() == 24 * 3600
        assert created.request_counts.processing == 2 and created.request_counts.errored == 1

        run_batch(batch_of(created).pk)

        ended = claude.messages.batches.retrieve(created.id)
        assert ended.processing_status == "ended" and ended.ended_at is not None
        assert ended.results_url == f"/v1/messages/batches/{created.id}/results"
        counts = ended.request_counts
        assert (counts.processing, counts.succeeded, counts.errored, counts.canceled, counts.expired) == (0, 2, 1, 0, 0)
        results = results_by_id(claude, created.id)
        assert set(results) == {"a", "b", "other"}
        a = results["a"]
        assert a.type == "succeeded" and a.message.type == "message" and a.message.role == "assistant"
        assert a.message.model == TRANSLATED and a.message.stop_reason == "end_turn"
        assert a.message.content[0].type == "text" and a.message.content[0].text.startswith("Simulated answer to:")
        assert a.message.usage.service_tier == "batch" and a.message.usage.output_tokens > 0
        other = results["other"]
        assert other.type == "errored" and other.error.type == "error"
        assert other.error.error.type == "invalid_request_error" and "single model" in other.error.error.message
        sent = {b["messages"][-1]["content"]: b for b in sim.bodies(CHAT)}
        assert sent["What is a batch?"]["messages"][0] == {"role": "system", "content": "Be brief."}
        assert sent["What is a batch?"]["max_tokens"] == 64 and sent["Stop early"]["stop"] == ["###"]
        assert sim.bodies(MESSAGES) == []
        # Translated calls are chat completions: no Anthropic headers (the dialect's, batches.endpoints.anthropic).
        assert all("anthropic-version" not in call["headers"] for call in sim.requests(CHAT))

    def test_it_passes_requests_through_to_a_native_deployment(self, claude, native, sim):
        params = request("n", "Native please", model=NATIVE, temperature=0.5)
        created = claude.messages.batches.create(requests=[params])
        run_batch(batch_of(created).pk)
        [sent] = sim.bodies(MESSAGES)
        assert sent == {**params["params"], "model": "sim-upstream"}
        # What Anthropic-format servers read (the dialect's upstream headers; x-api-key is a secret, not recorded).
        [call] = sim.requests(MESSAGES)
        assert call["headers"]["anthropic-version"] == "2023-06-01"
        [(custom_id, result)] = results_by_id(claude, created.id).items()
        assert custom_id == "n" and result.type == "succeeded"
        assert result.message.model == NATIVE and result.message.id.startswith("msg_")
        usage = result.message.usage
        assert usage.service_tier == "batch" and usage.input_tokens > 0
        batch = batch_of(created)
        batch.refresh_from_db()
        # Billing reads Anthropic's fields: the prompt is input + cache reads + cache writes.
        prompt = usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens
        assert (batch.input_tokens, batch.cached_tokens) == (prompt, usage.cache_read_input_tokens)
        assert batch.output_tokens == usage.output_tokens

    def test_it_lists_newest_first_paging_both_ways(self, claude, bob, translated):
        ids = [claude.messages.batches.create(requests=[request(f"r{i}")]).id for i in range(5)]
        Batch.objects.filter(organization=bob.org).delete()
        newest_first = ids[::-1]
        assert [b.id for b in claude.messages.batches.list(limit=2)] == newest_first  # auto-paging with after_id
        first = claude.messages.batches.list(limit=2)
        assert [b.id for b in first.data] == newest_first[:2] and first.has_more
        assert first.first_id == newest_first[0] and first.last_id == newest_first[1]
        older = claude.messages.batches.list(limit=2, after_id=first.last_id)
        assert [b.id for b in older.data] == newest_first[2:4]
        newer = claude.messages.batches.list(limit=2, before_id=newest_first[4])
        assert [b.id for b in newer.data] == newest_first[2:4] and newer.has_more
        # Auto-paging with before_id walks towards the newest, page by page.
        assert [b.id for b in claude.messages.batches.list(limit=2, before_id=newest_first[4])] == newest_first[
            2:4
        ] + newest_first[:2]
        with pytest.raises(anthropic.NotFoundError):
            claude.messages.batches.list(after_id="msgbatch_" + "0" * 32)

    def test_it_cancels_and_reports_canceled_results(self, claude, translated):
        created = claude.messages.batches.create(requests=[request("a"), request("b")])
        canceling = claude.messages.batches.cancel(created.id)
        assert canceling.processing_status == "canceling" and canceling.cancel_initiated_at is not None
        run_batch(batch_of(created).pk)
        ended = claude.messages.batches.retrieve(created.id)
        assert ended.processing_status == "ended" and ended.request_counts.canceled == 2
        assert {r.type for r in results_by_id(claude, created.id).values()} == {"canceled"}
        assert claude.messages.batches.cancel(created.id).processing_status == "ended"  # unchanged

    def test_it_expires_what_the_window_did_not_reach(self, claude, translated):
        created = claude.messages.batches.create(requests=[request("late")])
        Batch.objects.filter(pk=batch_of(created).pk).update(expires_at=timezone.now())
        run_batch(batch_of(created).pk)
        ended = claude.messages.batches.retrieve(created.id)
        assert ended.processing_status == "ended" and ended.request_counts.expired == 1
        assert results_by_id(claude, created.id)["late"].type == "expired"
        assert batch_of(created).status == BatchStatus.EXPIRED

    def test_it_deletes_only_ended_batches(self, claude, translated):
        created = claude.messages.batches.create(requests=[request("a")])
        with pytest.raises(anthropic.BadRequestError) as refused:
            claude.messages.batches.delete(created.id)
        assert refused.value.body["error"]["type"] == "invalid_request_error"
        assert "cancel it first" in refused.value.body["error"]["message"]
        run_batch(batch_of(created).pk)
        deleted = claude.messages.batches.delete(created.id)
        assert (deleted.id, deleted.type) == (created.id, "message_batch_deleted")
        with pytest.raises(anthropic.NotFoundError):
            claude.messages.batches.retrieve(created.id)
        assert not Batch.objects.filter(public_id=created.id.replace("msgbatch_", "batch_")).exists()

    def test_the_beta_client_and_bearer_tokens_work(self, live_server, alice, translated):
        beta = anthropic.Anthropic(base_url=live_server.url, auth_token=alice.key, max_retries=0)
        created = beta.beta.messages.batches.create(requests=[request("a")])
        assert beta.beta.messages.batches.retrieve(created.id).id == created.id
        assert [b.id for b in beta.beta.messages.batches.list()] == [created.id]

    def test_the_openai_dialect_sees_the_same_batch(self, claude, alice, translated):
        created = claude.messages.batches.create(requests=[request("a")])
        seen = alice.client.get(f"/v1/batches/{created.id.replace('msgbatch_', 'batch_')}").json()
        assert seen["endpoint"] == MESSAGES and seen["model"] == TRANSLATED
        assert seen["request_counts"]["total"] == 1


@pytest.mark.django_db(transaction=True)
class TestErrors:
    def test_a_wrong_key_is_an_authentication_error(self, live_server, translated):
        client = anthropic.Anthropic(base_url=live_server.url, api_key="or_wrong" + "x" * 40, max_retries=0)
        with pytest.raises(anthropic.AuthenticationError) as failed:
            client.messages.batches.list()
        assert failed.value.body["type"] == "error"
        assert failed.value.body["error"]["type"] == "authentication_error"

    def test_bad_creates_are_400s_in_anthropics_envelope(self, claude, translated):
        cases = [
            ([request("a"), request("a")], "duplicate_custom_id"),
            ([request("x" * 65)], "invalid_custom_id"),
            ([request("")], "invalid_custom_id"),
            ([], "empty_file"),
            ([{"custom_id": "a"}], "missing_required_parameter"),
        ]
        for requests, code in cases:
            with pytest.raises(anthropic.BadRequestError) as refused:
                claude.messages.batches.create(requests=requests)
            body = refused.value.body
            assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
            assert body["error"]["code"] == code and body["request_id"].startswith("req_")
        assert not Batch.objects.exists()

    def test_unknown_and_foreign_ids_are_404s(self, claude, bob, translated):
        other = anthropic.Anthropic(base_url=claude.base_url, api_key=bob.key, max_retries=0)
        theirs = other.messages.batches.create(requests=[request("a")])
        for missing in (theirs.id, "msgbatch_nope", "nothing"):
            with pytest.raises(anthropic.NotFoundError) as failed:
                claude.messages.batches.retrieve(missing)
            assert failed.value.body["error"]["type"] == "not_found_error"

    def test_results_before_the_end_are_refused(self, claude, live_server, alice, translated):
        created = claude.messages.batches.create(requests=[request("a")])
        with pytest.raises(anthropic.AnthropicError, match="results_url"):
            list(claude.messages.batches.results(created.id))  # the SDK asks only once results_url is set
        raw = httpx.get(f"{live_server.url}/v1/messages/batches/{created.id}/results", headers={"x-api-key": alice.key})
        assert raw.status_code == 400
        assert raw.json()["error"]["code"] == "batch_not_ended"

    def test_an_unknown_route_answers_anthropics_envelope(self, live_server, alice, translated):
        raw = httpx.get(f"{live_server.url}/v1/messages/batches/x/nothing", headers={"x-api-key": alice.key})
        assert raw.status_code == 404
        assert raw.json()["type"] == "error" and raw.json()["error"]["type"] == "not_found_error"
        raw = httpx.put(f"{live_server.url}/v1/messages/batches", headers={"x-api-key": alice.key})
        assert raw.status_code == 405 and raw.json()["error"]["type"] == "invalid_request_error"
        raw = httpx.get(f"{live_server.url}/v1/messages/batches")
        assert raw.status_code == 401 and raw.json()["error"]["type"] == "authentication_error"


@pytest.mark.django_db(transaction=True)
class TestLimits:
    def test_a_body_past_the_json_cap_but_within_the_batch_cap_is_taken(self, claude, translated, settings):
        settings.OPENRELAY_MAX_MESSAGE_BATCH_BYTES = 256 * 1024 * 1024
        text = "x" * 6000
        created = claude.messages.batches.create(requests=[request(f"r{i}", text) for i in range(2000)])
        assert created.request_counts.processing == 2000  # a 12 MB body: OPENRELAY_MAX_JSON_BODY_BYTES is 10 MB

    def test_a_body_past_the_batch_cap_is_a_413_naming_it(self, claude, translated, settings):
        settings.OPENRELAY_MAX_MESSAGE_BATCH_BYTES = 4096
        with pytest.raises(anthropic.APIStatusError) as refused:
            claude.messages.batches.create(requests=[request(f"r{i}", "y" * 100) for i in range(100)])
        assert refused.value.status_code == 413
        assert refused.value.body["error"]["type"] == "request_too_large"
        assert "OPENRELAY_MAX_MESSAGE_BATCH_BYTES" in refused.value.body["error"]["message"]

    def test_more_than_100000_requests_is_a_400(self, live_server, alice, translated):
        body = {"requests": [{"custom_id": f"r{i}", "params": {}} for i in range(100_001)]}
        raw = httpx.post(
            f"{live_server.url}/v1/messages/batches",
            content=orjson.dumps(body),
            headers={"x-api-key": alice.key, "content-type": "application/json"},
            timeout=60,
        )
        assert raw.status_code == 400
        assert raw.json()["error"]["code"] == "too_many_requests" and "100,000" in raw.json()["error"]["message"]


@pytest.mark.django_db(transaction=True)
class TestMoreOfTheContract:
    def test_model_server_errors_are_doubly_wrapped_errored_lines(self, claude, translated, native, sim):
        for model in (TRANSLATED, NATIVE):
            created = claude.messages.batches.create(
                requests=[
                    request("bad", "No [[status:400]]", model=model),
                    request("gone", "No [[status:404]]", model=model),
                ]
            )
            run_batch(batch_of(created).pk)
            results = results_by_id(claude, created.id)
            for custom_id, kind in (("bad", "invalid_request_error"), ("gone", "not_found_error")):
                error = results[custom_id].error
                assert results[custom_id].type == "errored" and error.type == "error", (model, results)
                assert error.error.type == kind and error.error.message and "sim-upstream" not in error.error.message
                assert error.request_id
            ended = claude.messages.batches.retrieve(created.id)
            assert ended.request_counts.errored == 2
            batch = batch_of(created)
            assert batch.input_tokens == batch.output_tokens == 0  # errored requests are not billed

    def test_an_idempotency_key_answers_the_first_batch_again(self, claude, translated):
        key = {"Idempotency-Key": "nightly-1"}
        first = claude.messages.batches.create(requests=[request("a")], extra_headers=key)
        again = claude.messages.batches.create(requests=[request("a")], extra_headers=key)
        assert again.id == first.id
        with pytest.raises(anthropic.ConflictError) as conflict:
            claude.messages.batches.create(requests=[request("b")], extra_headers=key)
        assert conflict.value.body["error"]["code"] == "idempotency_key_reused"

    def test_the_openai_dialect_runs_messages_lines_from_a_file(self, alice, translated):
        line = {"custom_id": "f-1", "method": "POST", "url": MESSAGES, "body": request("f-1")["params"]}
        upload = SimpleUploadedFile("m.jsonl", orjson.dumps(line) + b"\n", content_type="application/jsonl")
        file = alice.client.post("/v1/files", {"purpose": "batch", "file": upload}, format="multipart").json()
        created = alice.client.post(
            "/v1/batches",
            {"input_file_id": file["id"], "endpoint": MESSAGES, "completion_window": "24h"},
            format="json",
        ).json()
        run_batch(Batch.objects.get(public_id=created["id"]).pk)
        [output] = read_lines(Batch.objects.get(public_id=created["id"]).output_file)
        message = output["response"]["body"]
        assert message["type"] == "message" and message["content"][0]["type"] == "text"


@pytest.mark.django_db(transaction=True)
def test_a_list_page_costs_the_same_queries_whatever_its_length(alice, translated):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_X_API_KEY=alice.key)

    def create(n):
        for i in range(n):
            created = client.post("/v1/messages/batches", {"requests": [request(f"q{i}")]}, format="json").json()
            run_batch(Batch.objects.get(public_id=created["id"].replace("msgbatch_", "batch_")).pk)  # ended: counted

    def queries():
        client.get("/v1/messages/batches")  # the key's row is read once, then reused
        with CaptureQueriesContext(connection) as captured:
            assert client.get("/v1/messages/batches?limit=100").status_code == 200
        return len(captured)

    create(2)
    few = queries()
    create(4)
    assert queries() == few <= 3  # the page, and the canceled / expired counts of its ended batches
