"""POST /v1/batches: the happy path, inline requests, the batch object, prices, pins."""

import functools
from decimal import Decimal

import orjson
import pytest

from batches.models import Batch, BatchStatus, Record
from files import services as files
from files.models import File
from openrelay.api.timestamps import BATCH_TIMESTAMPS
from openrelay.core.models import Price
from tests.batches_api_tests.helpers import CHAT, GEMMA, chat_line, create, jsonl, upload

BATCH_KEYS = {
    "id",
    "object",
    "endpoint",
    "model",
    "errors",
    "input_file_id",
    "completion_window",
    "status",
    "output_file_id",
    "error_file_id",
    *BATCH_TIMESTAMPS,
    "request_counts",
    "metadata",
    "usage",
    "priority",
    "openrelay",
}


@pytest.mark.django_db
class TestCreate:
    def test_it_creates_a_batch_from_a_file(self, alice, gemma, settings):
        file = upload(alice, jsonl(chat_line("a"), chat_line("b")))
        response = create(alice, input_file_id=file.public_id, metadata={"team": "ocr"})
        assert response.status_code == 200, response.content
        body = response.json()
        assert set(body) == BATCH_KEYS
        assert body["id"].startswith("batch_")
        assert body["object"] == "batch"
        assert body["status"] == "validating"
        assert body["model"] == GEMMA
        assert body["errors"] is None
        assert body["input_file_id"] == file.public_id
        assert body["request_counts"] == {"total": 2, "completed": 0, "failed": 0}
        assert body["metadata"] == {"team": "ocr"}
        assert body["usage"] is None
        assert body["priority"] == "standard"
        assert body["expires_at"] - body["created_at"] == 24 * 3600
        for name in (
            "in_progress_at",
            "finalizing_at",
            "completed_at",
            "failed_at",
            "cancelled_at",
            "output_file_id",
            "error_file_id",
        ):
            assert body[name] is None

    def test_it_stores_records_as_pointers_into_the_file(self, alice, gemma):
        content = jsonl(chat_line("a"), "", chat_line("b", max_tokens=5), "   ", chat_line("c"))
        file = upload(alice, content)
        batch_id = create(alice, input_file_id=file.public_id).json()["id"]
        records = Record.objects.filter(batch__public_id=batch_id).order_by("line")
        assert [(r.line, r.custom_id) for r in records] == [(1, "a"), (3, "b"), (5, "c")]
        for record in records:
            raw = content[record.offset : record.offset + record.length]
            assert orjson.loads(raw)["custom_id"] == record.custom_id
            assert record.status == "pending"

    def test_it_stores_custom_ids_as_sent_whatever_characters_they_hold(self, alice, gemma):
        # PostgreSQL takes records through COPY's text format, where these four characters are escapes.
        ids = ["tab\there", "back\\slash", "new\nline", "carriage\rreturn", "\\N", "é ✓ 𝄞"]
        file = upload(alice, jsonl(*(chat_line(custom_id) for custom_id in ids)))
        batch_id = create(alice, input_file_id=file.public_id).json()["id"]
        stored = Record.objects.filter(batch__public_id=batch_id).order_by("line").values_list("custom_id", flat=True)
        assert list(stored) == ids

    def test_a_refused_file_leaves_no_records(self, alice, gemma, monkeypatch):
        # The scan refuses a file past the record limit only once it is past it: on PostgreSQL the
        # records before went into COPY already, and the refusal must take them back.
        from batches import services
        from batches.validation import jsonl as scanning

        file = upload(alice, jsonl(*(chat_line(f"r{i}") for i in range(4))))
        # A 50,001-record file says the same (test_create_params); a limit of 3 keeps this one small.
        monkeypatch.setattr(services, "scan", functools.partial(scanning.scan, max_records=3))
        monkeypatch.setattr(services, "_COPY_CHUNK", 1)  # each record on its way to the server at once
        response = create(alice, input_file_id=file.public_id)
        assert response.status_code == 400 and response.json()["error"]["code"] == "too_many_requests"
        assert not Batch.objects.exists() and not Record.objects.exists()
        monkeypatch.undo()
        assert create(alice, input_file_id=file.public_id).json()["request_counts"]["total"] == 4

    def test_deleting_a_batch_or_its_organization_deletes_its_records(self, alice, gemma):
        # Record.batch has no database constraint (create's bulk insert skips
        # its per-row check): the ORM's CASCADE is what removes records.
        first = create(alice, input_file_id=upload(alice, jsonl(chat_line("a"), chat_line("b"))).public_id).json()["id"]
        second = create(alice, input_file_id=upload(alice, jsonl(chat_line("c"))).public_id).json()["id"]
        Batch.objects.get(public_id=first).delete()
        assert not Record.objects.filter(batch__public_id=first).exists()
        assert Record.objects.filter(batch__public_id=second).count() == 1
        Batch.objects.get(public_id=second).organization.delete()
        assert Record.objects.count() == 0

    def test_it_skips_a_byte_order_mark(self, alice, gemma):
        content = b"\xef\xbb\xbf" + jsonl(chat_line("a"))
        batch_id = create(alice, input_file_id=upload(alice, content).public_id).json()["id"]
        record = Record.objects.get(batch__public_id=batch_id)
        assert record.offset == 3
        assert orjson.loads(content[record.offset : record.offset + record.length])["custom_id"] == "a"

    def test_it_accepts_a_last_line_without_newline_and_crlf(self, alice, gemma):
        content = orjson.dumps(chat_line("a")) + b"\r\n" + orjson.dumps(chat_line("b"))
        response = create(alice, input_file_id=upload(alice, content).public_id)
        assert response.json()["request_counts"]["total"] == 2
        assert response.json()["errors"] is None

    def test_it_pins_the_input_file(self, alice, gemma):
        file = upload(alice, jsonl(chat_line("a")))
        create(alice, input_file_id=file.public_id)
        file.refresh_from_db()
        assert file.pins == 1

    def test_it_snapshots_prices_and_the_multiplier(self, alice, gemma):
        Price.objects.create(
            model=gemma, input_per_mtok=Decimal("2"), cached_input_per_mtok=Decimal("1"), output_per_mtok=Decimal("8")
        )
        standard = create(alice, input_file_id=upload(alice, jsonl(chat_line("a"))).public_id).json()
        expedited = create(
            alice, input_file_id=upload(alice, jsonl(chat_line("a"))).public_id, priority="expedited"
        ).json()
        batch = Batch.objects.get(public_id=standard["id"])
        assert (batch.price_input, batch.price_cached_input, batch.price_output) == (2, 1, 8)
        assert batch.price_multiplier == Decimal("0.5")
        assert batch.model == gemma
        assert Batch.objects.get(public_id=expedited["id"]).price_multiplier == Decimal("1.0")
        assert expedited["priority"] == "expedited"

    def test_it_uses_zero_prices_without_a_price_row(self, alice, gemma):
        batch_id = create(alice, input_file_id=upload(alice, jsonl(chat_line("a"))).public_id).json()["id"]
        batch = Batch.objects.get(public_id=batch_id)
        assert (batch.price_input, batch.price_cached_input, batch.price_output) == (0, 0, 0)

    def test_it_stores_output_expires_after(self, alice, gemma):
        file = upload(alice, jsonl(chat_line("a")))
        response = create(
            alice, input_file_id=file.public_id, output_expires_after={"anchor": "created_at", "seconds": 7200}
        )
        assert "output_expires_after" not in response.json()  # create-only, as at OpenAI
        assert Batch.objects.get(public_id=response.json()["id"]).output_expires_after_s == 7200

    def test_it_enqueues_on_commit(self, alice, gemma, django_capture_on_commit_callbacks):
        file = upload(alice, jsonl(chat_line("a")))
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            assert create(alice, input_file_id=file.public_id).status_code == 200
        assert len(callbacks) == 1

    def test_it_creates_from_inline_requests(self, alice, gemma):
        response = create(alice, requests=[chat_line("a"), chat_line("b"), {"custom_id": "c"}])
        assert response.status_code == 200, response.content
        body = response.json()
        assert body["request_counts"]["total"] == 2
        assert body["errors"]["data"] == [
            {
                "code": "missing_required_parameter",
                "param": "method",
                "line": 3,
                "message": "Missing required parameter: 'method'.",
            }
        ]
        file = File.objects.get(public_id=body["input_file_id"])
        assert file.purpose == "batch" and file.organization == alice.org and file.pins == 1
        with files.open_content(file) as stream:
            lines = stream.read().splitlines()
        assert [orjson.loads(line)["custom_id"] for line in lines] == ["a", "b", "c"]
        records = Record.objects.filter(batch__public_id=body["id"]).order_by("line")
        assert [(r.line, r.custom_id) for r in records] == [(1, "a"), (2, "b")]

    def test_it_rejects_inline_items_that_are_not_objects(self, alice, gemma):
        body = create(alice, requests=[chat_line("a"), "text", 5]).json()
        assert [(e["code"], e["line"]) for e in body["errors"]["data"]] == [
            ("invalid_json_line", 2),
            ("invalid_json_line", 3),
        ]

    def test_it_fails_a_batch_whose_every_record_is_rejected(self, alice, gemma, django_capture_on_commit_callbacks):
        file = upload(alice, jsonl("{not json", chat_line("a", model="nope")))
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            response = create(alice, input_file_id=file.public_id)
        assert response.status_code == 200
        body = response.json()
        assert body["status"] == "failed"
        assert body["failed_at"] == body["created_at"]
        assert body["model"] is None
        assert body["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
        assert [e["code"] for e in body["errors"]["data"]] == ["invalid_json_line", "model_not_found"]
        assert body["errors"]["object"] == "list"
        # Nothing to run: the one callback is the live event of its end (batches.lifecycle).
        assert [c.__module__ for c in callbacks] == ["batches.lifecycle"]
        file.refresh_from_db()
        assert file.pins == 0  # a failed batch doesn't hold its file
        assert Batch.objects.get(public_id=body["id"]).status == BatchStatus.FAILED

    def test_it_accepts_every_endpoint(self, alice, gemma):
        cases = {
            "/v1/completions": {"prompt": "Say hi"},
            "/v1/embeddings": {"input": ["a", "b"]},
        }
        for endpoint, fields in cases.items():
            line = {"custom_id": "x", "method": "POST", "url": endpoint, "body": {"model": GEMMA, **fields}}
            response = create(alice, endpoint=endpoint, input_file_id=upload(alice, jsonl(line)).public_id)
            assert response.json()["errors"] is None, endpoint
            assert response.json()["endpoint"] == endpoint

    def test_it_refuses_another_organizations_file(self, alice, bob, gemma):
        file = upload(alice, jsonl(chat_line("a")))
        response = create(bob, input_file_id=file.public_id)
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["param"] == "input_file_id"
        assert error["message"] == (
            f"Cannot find file {file.public_id}, or organization 'bob-org' does not have access to it."
        )

    def test_it_leaves_no_inline_file_behind_when_refused(self, alice, gemma):
        before = File.objects.count()
        # Parses (depth <= 1024) but is too deep to write back as a line.
        deep = b"[" * 300 + b"]" * 300
        response = alice.client.post(
            "/v1/batches",
            content_type="application/json",
            data=(
                b'{"endpoint": "/v1/chat/completions", "completion_window": "24h", "requests": [{"x": ' + deep + b"}]}"
            ),
        )
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "requests[0]"
        assert File.objects.count() == before

    def test_it_reports_the_model_once_known(self, alice, gemma):
        body = create(alice, requests=[chat_line("a", stream=True), chat_line("b")]).json()
        assert body["model"] == GEMMA
        assert body["status"] == "validating"
        assert [e["code"] for e in body["errors"]["data"]] == ["streaming_unsupported"]

    def test_it_answers_the_created_batch_to_create_batch_callers(self, alice, gemma):
        from batches.services import create_batch
        from batches.validation.params import CreateParams

        file = upload(alice, jsonl(chat_line("a")))
        batch = create_batch(organization=alice.org, params=CreateParams(endpoint=CHAT, input_file_id=file.public_id))
        assert batch.pk and batch.total_count == 1 and batch.model_name == GEMMA


@pytest.mark.django_db
class TestCreateCleanup:
    def test_it_deletes_the_inline_file_when_the_create_fails_late(
        self, alice, gemma, monkeypatch, tmp_path, django_capture_on_commit_callbacks
    ):
        from batches import services
        from batches.validation.params import CreateParams

        def broken_batch_row(**fields):
            raise RuntimeError("disk full")

        # No request can make the write fail after the scan, so the unit is patched.
        monkeypatch.setattr(services, "_create_batch_row", broken_batch_row)
        with pytest.raises(RuntimeError), django_capture_on_commit_callbacks(execute=True):
            services.create_batch(organization=alice.org, params=CreateParams(endpoint=CHAT, requests=[chat_line("a")]))
        assert not File.objects.exists()
        assert not Batch.objects.exists()
        assert not any(path.is_file() for path in (tmp_path / "files").rglob("*"))
