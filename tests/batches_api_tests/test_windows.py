"""Completion windows (OPENRELAY_COMPLETION_WINDOWS): each offered one accepted with its expiry and
its rate, any other refused naming them, and shown where a user looks before submitting."""

from datetime import timedelta
from decimal import Decimal

import anthropic
import openai
import pytest

from batches import services
from batches.models import Batch, BatchStatus, RecordStatus
from openrelay.lib.env import parse_windows
from tests.batches_api_tests.helpers import CHAT, chat_line, create, jsonl
from tests.message_batches_tests.conftest import request

OFFERED = "1h:0.8,4h:0.65,24h:0.5,72h:0.4,90s:0.9"
SECONDS = {"90s": 90, "1h": 3600, "4h": 4 * 3600, "24h": 86400, "72h": 3 * 86400}
RATES = {"90s": "0.9", "1h": "0.8", "4h": "0.65", "24h": "0.5", "72h": "0.4"}

pytestmark = pytest.mark.usefixtures("tmp_storage")


@pytest.fixture
def offered(settings):
    settings.OPENRELAY_COMPLETION_WINDOWS = OFFERED


def _create(persona, window, **params):
    return create(persona, requests=[chat_line("a"), chat_line("b")], completion_window=window, **params)


def test_the_setting_parses_units_and_rates_shortest_first():
    assert parse_windows("1h:0.8,90s:1,2d:0.4,30m:0.7") == (
        ("90s", 90, "1"),
        ("30m", 1800, "0.7"),
        ("1h", 3600, "0.8"),
        ("2d", 172800, "0.4"),
    )
    for bad in (
        "24h",
        "24x:0.5",
        "h:0.5",
        "0h:0.5",
        "1h:0",
        "1h:1.5",
        "1h:half",
        "1h:0.5,1h:0.6",
        "1.5h:0.5",
        "1h:0.125",
    ):
        with pytest.raises(ValueError):
            parse_windows(bad)


@pytest.mark.django_db
class TestWindows:
    @pytest.mark.parametrize("window", list(SECONDS))
    def test_every_offered_window_is_accepted_with_its_expiry_and_rate(self, alice, gemma, offered, window):
        response = _create(alice, window)
        assert response.status_code == 200, response.content
        body = response.json()
        assert body["completion_window"] == window
        assert body["expires_at"] - body["created_at"] == SECONDS[window]
        batch = Batch.objects.get(public_id=body["id"])
        assert batch.price_multiplier == Decimal(RATES[window])

    def test_expedited_bills_the_sync_price_on_any_window(self, alice, gemma, offered):
        for window in ("90s", "72h"):
            body = _create(alice, window, priority="expedited").json()
            assert Batch.objects.get(public_id=body["id"]).price_multiplier == Decimal("1.0")

    @pytest.mark.parametrize("window", ["2h", "48h", "invalid", "", "24H", 24])
    def test_a_window_not_offered_is_a_400_naming_the_offered_ones(self, alice, gemma, offered, window):
        response = _create(alice, window)
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["param"] == "completion_window" and error["type"] == "invalid_request_error"
        for name in SECONDS:
            assert f"'{name}'" in error["message"]

    def test_the_default_offers_24h_only(self, alice, gemma):
        assert _create(alice, "24h").status_code == 200
        assert _create(alice, "1h").json()["error"]["param"] == "completion_window"

    def test_limits_and_models_show_the_windows_and_rates(self, alice, gemma, offered):
        limits = alice.client.get("/v1/limits").json()["batch"]
        assert limits["completion_windows"] == ["90s", "1h", "4h", "24h", "72h"]
        assert {w["window"]: (w["seconds"], w["rate"]) for w in limits["windows"]} == {
            name: (SECONDS[name], RATES[name]) for name in SECONDS
        }
        assert limits["window_seconds"] == 86400
        model = alice.client.get("/v1/models").json()["data"][0]["openrelay"]
        assert {w["window"]: w["rate"] for w in model["completion_windows"]} == RATES
        assert model["priority_multiplier"] == {"standard": "0.5", "expedited": "1.0"}

    def test_the_openapi_document_lists_the_offered_windows(self, client, offered):
        schema = client.get("/v1/openapi.json").json()["components"]["schemas"]["BatchCreate"]
        assert schema["properties"]["completion_window"]["enum"] == ["90s", "1h", "4h", "24h", "72h"]

    def test_a_retry_keeps_its_window(self, alice, gemma, offered):
        first = Batch.objects.get(public_id=_create(alice, "4h").json()["id"])
        Batch.objects.filter(pk=first.pk).update(status=BatchStatus.EXPIRED)
        first.records.update(status=RecordStatus.EXPIRED)
        first.refresh_from_db()
        retried = services.retry_failed(first)
        assert retried.completion_window == "4h"
        assert retried.expires_at - retried.created_at == timedelta(hours=4)


@pytest.mark.django_db(transaction=True)
class TestClients:
    def test_the_openai_sdk_sends_any_offered_window_unchanged(self, sdk, alice, gemma, offered):
        upload = sdk.files.create(file=("in.jsonl", jsonl(chat_line("a"))), purpose="batch")
        batch = sdk.batches.create(input_file_id=upload.id, endpoint=CHAT, completion_window="1h")  # type: ignore[arg-type]
        assert batch.completion_window == "1h" and batch.expires_at - batch.created_at == 3600
        with pytest.raises(openai.BadRequestError, match="completion_window"):
            sdk.batches.create(input_file_id=upload.id, endpoint=CHAT, completion_window="48h")  # type: ignore[arg-type]

    def test_anthropic_batches_keep_24h_unless_the_extension_names_a_window(self, claude, translated, offered):
        fixed = claude.messages.batches.create(requests=[request("a")])
        assert (fixed.expires_at - fixed.created_at).total_seconds() == 24 * 3600
        short = claude.messages.batches.create(
            requests=[request("a")], extra_body={"openrelay": {"completion_window": "90s"}}
        )
        assert (short.expires_at - short.created_at).total_seconds() == 90
        assert Batch.objects.get(public_id=short.id.replace("msgbatch_", "batch_")).price_multiplier == Decimal("0.9")
        with pytest.raises(anthropic.BadRequestError, match="completion_window"):
            claude.messages.batches.create(
                requests=[request("a")], extra_body={"openrelay": {"completion_window": "2h"}}
            )
