"""Answers checked against their contract, re-asked when they fail, counted when they can't be fixed."""

import orjson
from openai.types.responses import Response

from batches.engine.calls.usage import Usage
from batches.presenters import batch_object
from openrelay.simulator.answers import answer_chat, answer_responses
from tests.contract_tests.conftest import PERSON, chat_body, content_of, line, person_format, run
from tests.helpers import CHAT


def calls_for(sim, text):
    return [b for b in sim.bodies(CHAT) if b["messages"][0]["content"] == text]


def test_it_reasks_each_kind_of_invalid_answer_once_and_every_record_ends_valid(alice, model, sim):
    kinds = ("wrong_type", "missing_field", "truncated", "not_json")
    lines = [
        line(kind, chat_body(f"Who? [[invalid_output:{kind}]]", response_format=person_format())) for kind in kinds
    ]
    lines.append(line("fine", chat_body("Who?", response_format=person_format())))
    batch, out, err = run(alice, lines)
    assert not err and len(out) == 5
    for kind in kinds:
        assert content_of(out[kind]) == {"name": "sim", "age": 0}
        assert out[kind]["response"]["body"]["openrelay"] == {"reasks": 1}
    assert "openrelay" not in out["fine"]["response"]["body"]
    assert batch_object(batch)["openrelay"]["output_contracts"] == {"reasked": 4, "reasks": 4, "invalid_output": 0}


def test_a_reask_tells_the_model_its_answer_and_the_validators_errors(alice, model, sim):
    text = "Who? [[invalid_output:wrong_type]]"
    run(alice, [line("r", chat_body(text, response_format=person_format()))])
    first, second = calls_for(sim, text)
    assert len(first["messages"]) == 1 and "openrelay" not in second
    assistant, user = second["messages"][1:]
    assert assistant == {"role": "assistant", "content": '{"name": 12345, "age": 0}'}
    assert user["role"] == "user"
    assert '- $.name: 12345 is not of type "string"' in user["content"]
    assert second["response_format"] == person_format()  # the model still sees its format


def test_usage_is_summed_over_every_call_and_billed(alice, model, sim):
    text = "Who? [[invalid_output:missing_fieldx2]]"
    batch, out, _ = run(alice, [line("r", chat_body(text, response_format=person_format()))])
    bodies = calls_for(sim, text)
    assert len(bodies) == 3
    usage = sum((Usage.from_body(answer_chat(b)) for b in bodies), Usage())
    body = out["r"]["response"]["body"]
    assert body["openrelay"] == {"reasks": 2}
    assert body["usage"]["prompt_tokens"] == usage.prompt_tokens == batch.input_tokens
    assert body["usage"]["completion_tokens"] == usage.completion_tokens == batch.output_tokens


def test_an_answer_still_invalid_after_max_reasks_is_an_invalid_output_error_with_the_answer_kept(alice, model, sim):
    text = "Who? [[invalid_output:wrong_typex9]]"
    contract = {"output_contract": {"max_reasks": 1}}
    lines = [
        line("bad", chat_body(text, response_format=person_format(), openrelay=contract)),
        line("good", chat_body("Who?", response_format=person_format())),
    ]
    batch, out, err = run(alice, lines)
    assert list(out) == ["good"] and list(err) == ["bad"]
    error_line = err["bad"]
    assert error_line["error"]["code"] == "invalid_output"
    assert error_line["error"]["message"].startswith("The answer does not match the output contract after 1 re-ask:")
    assert "$.name: 12345 is not of type" in error_line["error"]["message"]
    kept = error_line["response"]["body"]
    assert error_line["response"]["status_code"] == 200
    assert kept["choices"][0]["message"]["content"] == '{"name": 12345, "age": 0}'
    assert kept["openrelay"]["reasks"] == 1
    assert kept["openrelay"]["output_errors"] == ['$.name: 12345 is not of type "string"']
    assert len(calls_for(sim, text)) == 2
    # Both its answers are billed (issue 56: a contract that never passes made them free), and the
    # kept answer's usage is that sum.
    both = sum((Usage.from_body(answer_chat(b)) for b in calls_for(sim, text)), Usage())
    assert kept["usage"]["prompt_tokens"] == both.prompt_tokens
    good = out["good"]["response"]["body"]["usage"]["prompt_tokens"]
    assert batch.input_tokens == good + both.prompt_tokens
    assert (batch.completed_count, batch.failed_count) == (1, 1)
    assert batch_object(batch)["openrelay"]["output_contracts"] == {"reasked": 1, "reasks": 1, "invalid_output": 1}


def test_the_error_file_holds_exactly_the_records_made_to_stay_invalid(alice, model, sim):
    lines = [
        line(
            f"r{i}",
            chat_body(
                f"Q{i} [[invalid_output:wrong_type{'x9' if i % 4 == 0 else ''}]]", response_format=person_format()
            ),
        )
        for i in range(12)
    ]
    batch, out, err = run(alice, lines)
    assert sorted(err) == ["r0", "r4", "r8"]
    assert all(item["error"]["code"] == "invalid_output" for item in err.values())
    assert len(out) == 9 and all(item["response"]["body"]["openrelay"] == {"reasks": 1} for item in out.values())
    assert (batch.reasked_count, batch.reasks_count, batch.invalid_output_count) == (12, 9 + 3 * 2, 3)


def test_the_results_of_one_failure_code_are_the_invalid_outputs(alice, model, sim):
    lines = [
        line("bad", chat_body("Q [[invalid_output:not_jsonx9]]", response_format=person_format())),
        line("http", chat_body("Q [[status:400]]")),
    ]
    batch, _, err = run(alice, lines)
    response = alice.client.get(f"/v1/batches/{batch.public_id}/results?kind=error&code=invalid_output")
    assert response.status_code == 200
    got = [orjson.loads(x) for x in b"".join(response.streaming_content).splitlines()]
    assert [item["custom_id"] for item in got] == ["bad"]
    response = alice.client.get(f"/v1/batches/{batch.public_id}/results?kind=error&code=http_400")
    got = [orjson.loads(x) for x in b"".join(response.streaming_content).splitlines()]
    assert [item["custom_id"] for item in got] == ["http"]
    assert err["http"]["error"] is None


def test_finish_reason_length_is_reasked_as_cut_json(alice, model, sim):
    text = "Who? [[invalid_output:truncated]]"
    _, out, _ = run(alice, [line("r", chat_body(text, response_format=person_format()))])
    first, second = calls_for(sim, text)
    assert "cut off at the token limit (finish_reason: length)" in second["messages"][2]["content"]
    assert out["r"]["response"]["body"]["choices"][0]["finish_reason"] == "stop"


def test_a_max_tokens_cut_that_never_fits_ends_invalid(alice, model, sim):
    body = chat_body("Who?", response_format=person_format(), max_tokens=3)
    _, _, err = run(alice, [line("r", body)])
    assert err["r"]["error"]["code"] == "invalid_output"
    assert err["r"]["response"]["body"]["choices"][0]["finish_reason"] == "length"
    assert "finish_reason: length" in err["r"]["error"]["message"]


def test_json_object_needs_a_json_object(alice, model, sim):
    lines = [
        line("obj", chat_body("Hi [[invalid_output:wrong_type]]", response_format={"type": "json_object"})),
        line("plain", chat_body("Hi")),
    ]
    _, out, err = run(alice, lines)
    assert not err
    assert list(content_of(out["obj"])) == ["answer"]
    assert out["obj"]["response"]["body"]["openrelay"] == {"reasks": 1}
    first = next(b for b in sim.bodies(CHAT) if len(b["messages"]) == 3)["messages"]
    assert first[1]["content"] == '["not", "an", "object"]'
    assert "the answer is JSON but not an object" in first[2]["content"]
    assert out["plain"]["response"]["body"]["choices"][0]["message"]["content"] == "Simulated answer to: Hi"


def test_an_explicit_record_contract_checks_answers_the_model_gave_freely(alice, model, sim):
    schema = {"type": "object", "properties": {"label": {"enum": ["spam", "ham"]}}, "required": ["label"]}
    contract = {"output_contract": {"schema": schema}}
    text = 'Label it [[answer_json:{"label": "spam"}]] [[invalid_output:wrong_type]]'
    _, out, err = run(alice, [line("r", chat_body(text, openrelay=contract))])
    assert not err and content_of(out["r"]) == {"label": "spam"}
    second = calls_for(sim, text)[1]
    assert "openrelay" not in second
    # The model never saw this schema: the re-ask quotes it.
    assert '"enum":["spam","ham"]' in second["messages"][2]["content"]


def test_the_record_schema_wins_over_its_response_format(alice, model, sim):
    schema = {"type": "object", "required": ["zip"]}
    body = chat_body(
        "Who?", response_format=person_format(), openrelay={"output_contract": {"schema": schema, "max_reasks": 0}}
    )
    _, _, err = run(alice, [line("r", body)])
    assert err["r"]["error"]["message"] == (
        'The answer does not match the output contract (no re-asks allowed): $: "zip" is a required property'
    )


def test_a_batch_contract_applies_to_every_record_and_false_turns_contracts_off(alice, model, sim):
    schema = {"type": "object", "required": ["name"]}
    lines = [
        line("a", chat_body('A [[answer_json:{"name": "x"}]] [[invalid_output:missing_field]]')),
        line("b", chat_body('B [[answer_json:{"nom": "x"}]]', openrelay={"output_contract": False})),
    ]
    _, out, err = run(alice, lines, openrelay={"output_contract": {"schema": schema, "max_reasks": 1}})
    assert not err
    assert out["a"]["response"]["body"]["openrelay"] == {"reasks": 1}
    assert "openrelay" not in out["b"]["response"]["body"]
    # Off for the whole batch: response_format gives no contract either.
    text = "C [[invalid_output:wrong_typex9]]"
    _, out, err = run(
        alice, [line("c", chat_body(text, response_format=person_format()))], openrelay={"output_contract": False}
    )
    assert not err and content_of(out["c"]) == {"name": 12345, "age": 0}


def test_responses_text_format_is_a_contract(alice, model, sim):
    fmt = {"format": {"type": "json_schema", "name": "person", "schema": PERSON}}
    body = {"model": model.name, "input": "Who? [[invalid_output:missing_field]]", "text": fmt}
    _, out, err = run(alice, [line("r", body, url="/v1/responses")], endpoint="/v1/responses")
    assert not err
    answer = out["r"]["response"]["body"]
    assert orjson.loads(answer["output"][-1]["content"][0]["text"]) == {"name": "sim", "age": 0}
    assert answer["openrelay"] == {"reasks": 1}
    Response.model_validate(answer)  # the openai SDK's type, with the summed usage
    first, second = sim.bodies("/v1/responses")
    summed = [b["usage"] for b in (answer_responses(first), answer_responses(second))]
    assert answer["usage"]["input_tokens"] == sum(u["input_tokens"] for u in summed)
    assert [item["role"] for item in second["input"]] == ["user", "assistant", "user"]
