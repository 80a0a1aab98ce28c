"""A Message Batch's params checked at create, in Anthropic's shapes (batches.validation.messages): a bad
request is a 400 naming its index, custom_id and field, and nothing is made; a valid one still runs."""

import anthropic
import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from batches.engine.runner import run_batch
from batches.models import Batch
from batches.validation import messages
from files.models import File
from openrelay.core.models import Model
from tests.message_batches_tests.conftest import TRANSLATED, request
from tests.reliability_tests.test_fuzz import FUZZ, JSON_VALUES  # random JSON: huge numbers, odd text, nesting

BLOCK = {"type": "text", "text": "x"}
USER = {"role": "user", "content": "Hello"}

# (field the 400 names under requests.1.params, the params' change, OpenRelay's code). None deletes the field.
BAD_PARAMS = [
    ("max_tokens", {"max_tokens": 10**30}, "invalid_type"),  # JSON reads it as 1e30, a number that is no integer
    ("max_tokens", {"max_tokens": 10**12}, "invalid_value"),  # past the ceiling of a model with no cap of its own
    ("max_tokens", {"max_tokens": 0}, "invalid_value"),
    ("max_tokens", {"max_tokens": "64"}, "invalid_type"),
    ("max_tokens", {"max_tokens": True}, "invalid_type"),
    ("max_tokens", {"max_tokens": None}, "missing_required_parameter"),
    ("model", {"model": "no/such-model"}, "model_not_found"),
    ("model", {"model": None}, "missing_required_parameter"),
    ("model", {"model": 5}, "invalid_type"),
    ("messages", {"messages": "Hello"}, "invalid_type"),
    ("messages", {"messages": []}, "invalid_value"),
    ("messages", {"messages": None}, "missing_required_parameter"),
    ("messages.0", {"messages": ["Hello"]}, "invalid_type"),
    ("messages.0.role", {"messages": [{"role": "system", "content": "Hi"}]}, "invalid_value"),
    ("messages.1.content", {"messages": [USER, {"role": "assistant"}]}, "missing_required_parameter"),
    ("messages.0.content", {"messages": [{"role": "user", "content": 5}]}, "invalid_type"),
    ("messages.0.content.1.type", {"messages": [{"role": "user", "content": [BLOCK, {"text": "x"}]}]}, "invalid_type"),
    ("messages.0.content.0.text", {"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "invalid_type"),
    ("system", {"system": 5}, "invalid_type"),
    ("system.0", {"system": ["Be brief."]}, "invalid_type"),
    ("temperature", {"temperature": 1.5}, "invalid_value"),
    ("temperature", {"temperature": "hot"}, "invalid_type"),
    ("top_p", {"top_p": 2}, "invalid_value"),
    ("top_k", {"top_k": -1}, "invalid_value"),
    ("top_k", {"top_k": 1.5}, "invalid_type"),
    ("stop_sequences", {"stop_sequences": "END"}, "invalid_type"),
    ("stop_sequences.1", {"stop_sequences": ["END", 1]}, "invalid_type"),
    ("stream", {"stream": True}, "streaming_unsupported"),
    ("tools", {"tools": {"name": "weather"}}, "invalid_type"),
    ("tools.0.name", {"tools": [{"description": "no name", "input_schema": {"type": "object"}}]}, "invalid_type"),
    ("tool_choice.type", {"tool_choice": {"type": "sometimes"}}, "invalid_value"),
    ("tool_choice.name", {"tool_choice": {"type": "tool"}}, "invalid_type"),
    ("metadata", {"metadata": "user-1"}, "invalid_type"),
    # Past the table: the anthropic SDK's published MessageCreateParams (openrelay.lib.request_schemas).
    ("thinking.type", {"thinking": {"type": "banana"}}, "invalid_value"),
    ("tools.0.input_schema", {"tools": [{"name": "weather", "input_schema": "any"}]}, "invalid_type"),
]


def bad_request(change):
    params = {**request("bad")["params"], **change}
    return {"custom_id": "bad", "params": {k: v for k, v in params.items() if v is not None}}


def create_raw(live_server, key, requests):
    """POST the body as JSON the way any client would (10**30 stays a 31-digit JSON number)."""
    return httpx.post(
        f"{live_server.url}/v1/messages/batches",
        json={"requests": requests},
        headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
        timeout=30,
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("tmp_storage")
class TestCreateChecks:
    def test_each_bad_params_is_a_400_naming_the_request_and_field(self, live_server, alice, translated):
        for field, change, code in BAD_PARAMS:
            answer = create_raw(live_server, alice.key, [request("good"), bad_request(change)])
            body = answer.json()
            assert answer.status_code == 400, (field, change, body)
            assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", (field, body)
            assert body["error"]["param"] == f"requests.1.params.{field}", (change, body)
            assert body["error"]["code"] == code, (field, change, body)
            message = body["error"]["message"]
            assert message.startswith(f"requests.1.params.{field}") and "'bad'" in message, message
        assert not Batch.objects.exists() and not File.objects.exists()

    def test_the_sdk_gets_a_bad_request_error(self, claude, translated):
        bad = bad_request({"messages": "Hello"})
        with pytest.raises(anthropic.BadRequestError) as refused:
            claude.messages.batches.create(requests=[request("good"), bad])
        error = refused.value.body["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == "requests.1.params.messages"
        assert "custom_id 'bad'" in error["message"] and "list" in error["message"]
        assert not Batch.objects.exists()

    def test_max_tokens_is_held_to_the_models_cap(self, live_server, alice, translated):
        Model.objects.filter(name=TRANSLATED).update(max_output_tokens=4096)
        answer = create_raw(live_server, alice.key, [request("over", max_tokens=4097)])
        assert answer.status_code == 400
        error = answer.json()["error"]
        assert error["param"] == "requests.0.params.max_tokens" and error["code"] == "invalid_value"
        assert f"4097 > 4096, which is the maximum allowed number of output tokens for {TRANSLATED}" in error["message"]
        assert create_raw(live_server, alice.key, [request("at-cap", max_tokens=4096)]).status_code == 200

    def test_a_disabled_model_is_refused(self, live_server, alice, translated):
        Model.objects.filter(name=TRANSLATED).update(enabled=False)
        answer = create_raw(live_server, alice.key, [request("a")])
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "model_not_found"
        assert not Batch.objects.exists()

    def test_an_idempotency_key_is_free_again_after_a_refusal(self, claude, translated):
        key = {"Idempotency-Key": "retry-me"}
        with pytest.raises(anthropic.BadRequestError):
            claude.messages.batches.create(requests=[request("a", max_tokens=0)], extra_headers=key)
        created = claude.messages.batches.create(requests=[request("a")], extra_headers=key)
        assert created.request_counts.processing == 1

    def test_every_valid_shape_is_taken_and_runs(self, claude, translated):
        Model.objects.filter(name=TRANSLATED).update(max_output_tokens=4096)
        weather = {"name": "get_weather", "description": "The weather", "input_schema": {"type": "object"}}
        conversation = [
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny"}]},
        ]
        created = claude.messages.batches.create(
            requests=[
                request("plain"),
                request("at-cap", max_tokens=4096, stream=False),
                request("blocks", system=[{"type": "text", "text": "Be brief."}], stop_sequences=["###"]),
                request("sampling", temperature=0, top_p=1, top_k=5, metadata={"user_id": "u-1"}),
                request("extras", thinking={"type": "enabled", "budget_tokens": 1024}, service_tier="auto"),
                {
                    "custom_id": "tools",
                    "params": {
                        "model": TRANSLATED,
                        "max_tokens": 64,
                        "tools": [weather],
                        "tool_choice": {"type": "tool", "name": "get_weather"},
                        "messages": conversation,
                    },
                },
            ]
        )
        assert created.request_counts.processing == 6 and created.request_counts.errored == 0
        run_batch(Batch.objects.get(public_id=created.id.replace("msgbatch_", "batch_")).pk)
        results = {r.custom_id: r.result for r in claude.messages.batches.results(created.id)}
        assert {custom_id: result.type for custom_id, result in results.items()} == {
            "plain": "succeeded",
            "at-cap": "succeeded",
            "blocks": "succeeded",
            "sampling": "succeeded",
            "extras": "succeeded",
            "tools": "succeeded",
        }, results


CODES = {"invalid_type", "invalid_value", "missing_required_parameter", "model_not_found", "streaming_unsupported"}


@FUZZ
@given(field=st.sampled_from(sorted(messages.FIELDS)), value=JSON_VALUES)
def test_any_json_in_a_field_passes_or_is_refused_naming_it(field, value):
    params = {"model": "m", "max_tokens": 16, "messages": [USER], field: value}
    try:
        messages.check(params, messages.Catalog({"m": None}))
    except messages.ParamInvalid as problem:
        assert problem.field.split(".")[0] == field and problem.code in CODES and problem.message
