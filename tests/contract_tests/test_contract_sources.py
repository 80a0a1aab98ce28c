"""Where a contract comes from, and the contracts create refuses (invalid_output_contract, with the line)."""

import pytest

from batches.models import Batch
from batches.validation.contracts import DEFAULT_MAX_REASKS, MAX_REASKS_CAP, contract_for, normalize_output_contract
from tests.contract_tests.conftest import PERSON, chat_body, create, line, person_format
from tests.helpers import CHAT, MODEL

RESPONSES = "/v1/responses"


def test_response_format_json_schema_gives_a_contract_with_the_default_reasks():
    contract = contract_for(chat_body("x", response_format=person_format()), CHAT)
    assert contract.source == "response_format" and contract.max_reasks == DEFAULT_MAX_REASKS
    assert contract.validator().is_valid({"name": "a", "age": 1})
    assert not contract.validator().is_valid({"name": "a"})


def test_json_object_gives_a_contract_without_a_schema_and_text_gives_none():
    assert contract_for(chat_body("x", response_format={"type": "json_object"}), CHAT).schema_text is None
    assert contract_for(chat_body("x", response_format={"type": "text"}), CHAT) is None
    assert contract_for(chat_body("x"), CHAT) is None


def test_responses_text_format_gives_a_contract():
    body = {"model": MODEL, "input": "x", "text": {"format": {"type": "json_schema", "name": "p", "schema": PERSON}}}
    assert contract_for(body, RESPONSES).validator().is_valid({"name": "a", "age": 1})
    body["text"] = {"format": {"type": "json_object"}}
    assert contract_for(body, RESPONSES).schema_text is None


def test_a_record_contract_wins_over_the_batch_and_the_batch_over_the_default():
    batch = normalize_output_contract({"schema": {"type": "object"}, "max_reasks": 4})
    assert contract_for(chat_body("x"), CHAT, batch).source == "batch"
    assert contract_for(chat_body("x"), CHAT, batch).max_reasks == 4
    own = {"output_contract": {"schema": {"type": "array"}, "max_reasks": 1}}
    contract = contract_for(chat_body("x", openrelay=own), CHAT, batch)
    assert (contract.source, contract.max_reasks) == ("record", 1)
    # A batch's max_reasks alone tunes the records that ask for JSON, and leaves the others alone.
    tune = normalize_output_contract({"max_reasks": 3})
    assert contract_for(chat_body("x", response_format=person_format()), CHAT, tune).max_reasks == 3
    assert contract_for(chat_body("x"), CHAT, tune) is None


def test_max_reasks_is_clamped_to_its_cap_and_zero_means_check_only():
    assert normalize_output_contract({"max_reasks": 99})["max_reasks"] == MAX_REASKS_CAP
    assert normalize_output_contract({"max_reasks": 0})["max_reasks"] == 0


@pytest.mark.parametrize(
    ("contract", "param", "words"),
    [
        ({"schema": {"type": "nope"}}, "body.openrelay.output_contract.schema", "not a valid JSON Schema"),
        ({"schema": {"pattern": "("}}, "body.openrelay.output_contract.schema", "not a valid JSON Schema"),
        ({"schema": {"$ref": "http://127.0.0.1:9/s.json"}}, "body.openrelay.output_contract.schema", "remote $ref"),
        ({"schema": "object"}, "body.openrelay.output_contract.schema", "expected an object (a JSON Schema)"),
        ({"max_reasks": -1}, "body.openrelay.output_contract.max_reasks", "non-negative integer"),
        ({"max_reasks": "2"}, "body.openrelay.output_contract.max_reasks", "expected an integer"),
        ({"max_reask": 2}, "body.openrelay.output_contract.max_reask", "Unknown parameter"),
        ({"max_reasks": 2}, "body.openrelay.output_contract", "needs a 'schema'"),
        ("yes", "body.openrelay.output_contract", "expected an object or false"),
    ],
)
def test_an_invalid_record_contract_rejects_the_record_at_create(alice, model, contract, param, words):
    lines = [line("ok", chat_body("a")), line("bad", chat_body("b", openrelay={"output_contract": contract}))]
    answer = create(alice, lines)
    [error] = answer["errors"]["data"]
    assert (error["code"], error["param"], error["line"]) == ("invalid_output_contract", param, 2)
    assert words in error["message"]
    assert answer["request_counts"]["total"] == 1


def test_a_response_format_with_an_invalid_schema_rejects_the_record(alice, model):
    body = chat_body("b", response_format=person_format({"type": "object", "properties": {"a": {"type": 7}}}))
    [error] = create(alice, [line("ok", chat_body("a")), line("bad", body)])["errors"]["data"]
    assert (error["code"], error["param"]) == ("invalid_output_contract", "body.response_format.json_schema.schema")


def test_a_contract_on_an_endpoint_without_text_answers_is_refused(alice, model):
    body = {"model": MODEL, "input": "x", "openrelay": {"output_contract": {"schema": {}}}}
    [error] = create(alice, [line("r", body, url="/v1/embeddings")], endpoint="/v1/embeddings")["errors"]["data"]
    assert error["code"] == "invalid_output_contract"
    answer = create(
        alice,
        [line("r", {"model": MODEL, "input": "x"}, url="/v1/embeddings")],
        endpoint="/v1/embeddings",
        expect=400,
        openrelay={"output_contract": {"schema": {"type": "object"}}},
    )
    assert answer["error"]["code"] == "invalid_output_contract"


def test_a_workflow_record_carries_its_contracts_on_its_requests(alice, model):
    alice.org.workflows_enabled = True
    alice.org.save(update_fields=["workflows_enabled"])
    extension = {"workflow": {"url": "http://127.0.0.1:9/cb"}, "output_contract": {"schema": {}}}
    [error] = create(alice, [line("ok", chat_body("a")), line("w", chat_body("b", openrelay=extension))])["errors"][
        "data"
    ]
    assert error["code"] == "invalid_output_contract" and "on its requests" in error["message"]


@pytest.mark.parametrize(
    ("value", "param", "code"),
    [
        ({"output_contract": {"schema": {"type": 1}}}, "openrelay.output_contract.schema", "invalid_output_contract"),
        ({"output_contract": {"max_reasks": -2}}, "openrelay.output_contract.max_reasks", "invalid_output_contract"),
        ({"contract": {}}, "openrelay.contract", "unknown_parameter"),
        ("x", "openrelay", "invalid_type"),
    ],
)
def test_an_invalid_batch_contract_refuses_the_create(alice, model, value, param, code):
    answer = create(alice, [line("r", chat_body("a"))], expect=400, openrelay=value)
    assert (answer["error"]["code"], answer["error"]["param"]) == (code, param)
    assert not Batch.objects.exists()


def test_the_batch_contract_is_kept_and_shown_with_its_counts(alice, model):
    contract = {"schema": {"type": "object"}, "max_reasks": 3}
    answer = create(alice, [line("r", chat_body("a"))], openrelay={"output_contract": contract})
    batch = Batch.objects.get(public_id=answer["id"])
    assert batch.output_contract == contract
    assert answer["openrelay"]["output_contracts"] == {"reasked": 0, "reasks": 0, "invalid_output": 0}
