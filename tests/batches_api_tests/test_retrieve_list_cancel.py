"""GET /v1/batches/{id}, GET /v1/batches, POST /v1/batches/{id}/cancel, and isolation."""

from datetime import timedelta

import pytest
from django.utils import timezone

from batches import lifecycle, services
from batches.lifecycle import IllegalTransition
from batches.models import Batch, BatchStatus
from batches.presenters import batch_object
from files.models import File
from openrelay.api.errors import Conflict
from tests.batches_api_tests.helpers import chat_line, create, error_of


def _batch(persona, **fields):
    """A created batch row (through the API), with `fields` forced onto it afterwards."""
    body = create(persona, requests=[chat_line("a"), chat_line("b")]).json()
    batch = Batch.objects.get(public_id=body["id"])
    if fields:
        Batch.objects.filter(pk=batch.pk).update(**fields)
        batch.refresh_from_db()
    return batch


@pytest.mark.django_db
class TestRetrieve:
    def test_it_retrieves_a_batch(self, alice, gemma):
        batch = _batch(alice)
        response = alice.client.get(f"/v1/batches/{batch.public_id}")
        assert response.status_code == 200
        assert response.json() == batch_object(batch)

    def test_it_hides_other_organizations_batches(self, alice, bob, gemma):
        batch = _batch(alice)
        for response in (
            bob.client.get(f"/v1/batches/{batch.public_id}"),
            bob.client.post(f"/v1/batches/{batch.public_id}/cancel"),
            alice.client.get("/v1/batches/batch_nope"),
        ):
            error = error_of(response, 404)
            assert error["type"] == "not_found_error"
            assert error["message"].startswith("No batch found with id ")
        assert bob.client.get("/v1/batches").json()["data"] == []
        batch.refresh_from_db()
        assert batch.status == BatchStatus.VALIDATING

    def test_it_shows_result_files_usage_and_timestamps(self, alice, gemma):
        batch = _batch(alice)
        now = timezone.now()
        output = File.objects.create(
            organization=alice.org, filename="o.jsonl", purpose="batch_output", storage_name="x"
        )
        Batch.objects.filter(pk=batch.pk).update(
            status=BatchStatus.COMPLETED,
            in_progress_at=now,
            finalizing_at=now,
            completed_at=now,
            output_file=output,
            completed_count=2,
            input_tokens=100,
            cached_tokens=10,
            output_tokens=50,
            reasoning_tokens=5,
        )
        body = alice.client.get(f"/v1/batches/{batch.public_id}").json()
        assert body["output_file_id"] == output.public_id
        assert body["error_file_id"] is None
        assert body["completed_at"] == int(now.timestamp())
        assert body["request_counts"] == {"total": 2, "completed": 2, "failed": 0}
        assert body["usage"] == {
            "input_tokens": 100,
            "input_tokens_details": {"cached_tokens": 10},
            "output_tokens": 50,
            "output_tokens_details": {"reasoning_tokens": 5},
            "total_tokens": 150,
        }
        # The cost breakdown is ours, so it lives in the extension object, not in OpenAI's usage.
        assert body["openrelay"]["cost"] == {
            "currency": "USD",
            "input": "0.000000000",
            "cached_input": "0.000000000",
            "output": "0.000000000",
            "total": "0.000000000",
        }


@pytest.mark.django_db
class TestList:
    def _make(self, persona, count):
        start = timezone.now() - timedelta(hours=1)
        ids = []
        for i in range(count):
            batch = _batch(persona)
            # Two share a created_at so the pk tie-break is exercised.
            Batch.objects.filter(pk=batch.pk).update(created_at=start + timedelta(seconds=i // 2))
            ids.append(batch.public_id)
        return ids[::-1]  # newest first

    def test_it_lists_newest_first_with_cursor_pages(self, alice, bob, gemma):
        ids = self._make(alice, 5)
        _batch(bob)
        page = alice.client.get("/v1/batches", {"limit": 2}).json()
        assert page["object"] == "list"
        assert [b["id"] for b in page["data"]] == ids[:2]
        assert (page["first_id"], page["last_id"], page["has_more"]) == (ids[0], ids[1], True)
        seen = [b["id"] for b in page["data"]]
        while page["has_more"]:
            page = alice.client.get("/v1/batches", {"limit": 2, "after": page["data"][-1]["id"]}).json()
            seen += [b["id"] for b in page["data"]]
        assert seen == ids
        assert page["has_more"] is False

    def test_it_defaults_to_20(self, alice, gemma):
        ids = self._make(alice, 21)
        page = alice.client.get("/v1/batches").json()
        assert len(page["data"]) == 20 and page["has_more"] is True
        assert page["data"][-1]["id"] == ids[19]

    def test_it_answers_an_empty_page(self, alice):
        assert alice.client.get("/v1/batches").json() == {
            "object": "list",
            "data": [],
            "first_id": None,
            "last_id": None,
            "has_more": False,
        }

    @pytest.mark.parametrize("limit", ["0", "101", "-1", "x", "2.5"])
    def test_it_refuses_a_bad_limit(self, alice, limit):
        error = error_of(alice.client.get("/v1/batches", {"limit": limit}))
        assert (error["param"], error["code"]) == ("limit", "invalid_value")

    def test_it_refuses_an_unknown_cursor(self, alice, bob, gemma):
        other = _batch(bob)
        for after in ("batch_nope", other.public_id):
            error = error_of(alice.client.get("/v1/batches", {"after": after}), 404)
            assert (error["param"], error["code"], error["type"]) == ("after", "not_found", "not_found_error")

    def test_it_uses_a_constant_number_of_queries(self, alice, gemma, django_assert_num_queries):
        ids = self._make(alice, 12)
        output = File.objects.create(organization=alice.org, filename="o", purpose="batch_output", storage_name="x")
        Batch.objects.filter(public_id__in=ids).update(output_file=output, error_file=output)
        alice.client.get("/v1/batches")  # reads the key (once per 5 s: openrelay.core.auth), warms last_used_at
        # page (1); and + cursor (1) with `after`.
        for params in ({"limit": 1}, {"limit": 100}):
            with django_assert_num_queries(1):
                assert alice.client.get("/v1/batches", params).status_code == 200
        for limit in (1, 100):
            with django_assert_num_queries(2):
                alice.client.get("/v1/batches", {"limit": limit, "after": ids[0]})


@pytest.mark.django_db
class TestCancel:
    def test_it_cancels_a_validating_batch(self, alice, gemma, django_capture_on_commit_callbacks):
        batch = _batch(alice)
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            response = alice.client.post(f"/v1/batches/{batch.public_id}/cancel")
        assert response.status_code == 200
        body = response.json()
        assert body["status"] == "cancelling"
        assert body["cancelling_at"] is not None
        assert len(callbacks) == 1  # a worker is asked to finish the cancellation
        assert Batch.objects.get(pk=batch.pk).status == BatchStatus.CANCELLING

    def test_it_cancels_an_in_progress_batch(self, alice, gemma):
        batch = _batch(alice, status=BatchStatus.IN_PROGRESS, in_progress_at=timezone.now())
        assert alice.client.post(f"/v1/batches/{batch.public_id}/cancel").json()["status"] == "cancelling"

    def test_it_tolerates_an_empty_json_body(self, alice, gemma):
        batch = _batch(alice)
        response = alice.client.generic(
            "POST", f"/v1/batches/{batch.public_id}/cancel", data=b"", content_type="application/json"
        )
        assert response.status_code == 200

    @pytest.mark.parametrize("status", [BatchStatus.CANCELLING, BatchStatus.CANCELLED])
    def test_it_answers_a_cancelled_batch_unchanged(self, alice, gemma, status, django_capture_on_commit_callbacks):
        batch = _batch(alice, status=status)
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            response = alice.client.post(f"/v1/batches/{batch.public_id}/cancel")
        assert response.status_code == 200
        assert response.json() == batch_object(batch)
        assert callbacks == []

    @pytest.mark.parametrize(
        "status", [BatchStatus.COMPLETED, BatchStatus.FAILED, BatchStatus.EXPIRED, BatchStatus.FINALIZING]
    )
    def test_it_refuses_to_cancel_a_finished_batch(self, alice, gemma, status):
        batch = _batch(alice, status=status)
        response = alice.client.post(f"/v1/batches/{batch.public_id}/cancel")
        error = error_of(response, 409)
        assert error["message"] == f"Cannot cancel a batch with status '{status}'."
        assert response["x-should-retry"] == "false"
        assert Batch.objects.get(pk=batch.pk).status == status

    def test_it_follows_a_lost_race(self, alice, gemma):
        # The instance still says validating while the engine already moved it on.
        batch = _batch(alice)
        Batch.objects.filter(pk=batch.pk).update(status=BatchStatus.IN_PROGRESS)
        assert services.cancel_batch(batch).status == BatchStatus.CANCELLING
        stale = _batch(alice)
        Batch.objects.filter(pk=stale.pk).update(status=BatchStatus.COMPLETED)
        with pytest.raises(Conflict):
            services.cancel_batch(stale)
        raced = _batch(alice)
        Batch.objects.filter(pk=raced.pk).update(status=BatchStatus.CANCELLED)
        assert services.cancel_batch(raced).status == BatchStatus.CANCELLED


@pytest.mark.django_db
class TestLifecycle:
    def test_it_refuses_illegal_transitions(self, alice, gemma):
        batch = _batch(alice, status=BatchStatus.COMPLETED)
        for target in (BatchStatus.CANCELLING, BatchStatus.IN_PROGRESS, BatchStatus.FAILED):
            with pytest.raises(IllegalTransition):
                lifecycle.transition(batch, target)
        failed = _batch(alice)
        assert lifecycle.transition(failed, BatchStatus.FAILED)
        with pytest.raises(IllegalTransition):
            lifecycle.transition(failed, BatchStatus.CANCELLING)
        assert Batch.objects.get(pk=batch.pk).status == BatchStatus.COMPLETED


@pytest.mark.django_db
def test_a_batch_get_is_one_query_once_the_key_is_known(alice, gemma, django_assert_num_queries):
    # Issue 42 finding 7: 100 polling clients. The key's row is read once per 5 s (openrelay.core.auth),
    # the batch with its result files' ids in one query.
    batch = _batch(alice)
    output = File.objects.create(organization=alice.org, filename="o", purpose="batch_output", storage_name="x")
    Batch.objects.filter(pk=batch.pk).update(output_file=output, error_file=output)
    url = f"/v1/batches/{batch.public_id}"
    alice.client.get(url)
    with django_assert_num_queries(1):
        assert alice.client.get(url).json()["output_file_id"] == output.public_id
