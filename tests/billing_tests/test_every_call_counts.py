"""Every model call that returned an answer counts (docs/concepts/billing.md, "What is billed").

A record that fails its output contract, or whose re-ask call fails, is billed every answer
it got; a tool-calling record that fails mid-loop is billed nothing (batch-api.txt), but its
answers' tokens show as unbilled usage, on the batch, in the ledger and in the organization's
usage, and count against the monthly budget all the same.

Measured before this file (issue 56, finding 2): three records of `{"type": "array"}` with
max_reasks 2 made 9 calls and billed 0 tokens; the organization's usage did not move.
"""

from decimal import Decimal

from batches import guardrails
from batches.engine.calls.caller import Usage
from batches.engine.runner import run_batch
from billing.pricing import Prices, cost
from openrelay.simulator.answers import answer_chat
from tests.billing_tests.conftest import (
    PRICE_CACHED_INPUT,
    PRICE_INPUT,
    PRICE_OUTPUT,
    WEATHER_TOOL,
    as_usd,
    assert_billed,
    create,
    first_message,
    oracle_cost,
    usage_of_lines,
)
from tests.fixtures.tool_executor import status
from tests.helpers import CHAT, chat, read_lines

NEVER = {"type": "array"}  # the simulator's literal answer below is an object: it never passes
OBJECT = '[[answer_json:{"name": "x"}]]'
USAGE_URL = "/v1/organization/usage"


def contract_record(text, schema, max_reasks):
    return chat(text, openrelay={"output_contract": {"schema": schema, "max_reasks": max_reasks}})


def calls_of(sim, start):
    return [body for body in sim.bodies(CHAT) if first_message(body).startswith(start)]


def summed(bodies):
    return sum((Usage.from_body(answer_chat(body)) for body in bodies), Usage())


def line_usage(error_line):
    usage = error_line["response"]["body"]["usage"]
    return usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"], usage["completion_tokens"]


def tokens(usage):
    return usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens


def org_total(persona):
    total = persona.client.get(USAGE_URL).json()["total"]
    return total["input_tokens"], total["cached_tokens"], total["output_tokens"]


def test_a_contract_that_never_passes_bills_its_nine_calls(alice, model, sim):
    batch = create(alice, [contract_record(f"never {i} {OBJECT}", NEVER, 2) for i in range(3)])
    run_batch(batch.pk)
    batch.refresh_from_db()
    assert (batch.status, batch.completed_count, batch.failed_count) == ("completed", 0, 3)
    bodies = calls_of(sim, "never ")
    assert len(bodies) == 9  # each record: its call and 2 re-asks
    billed = summed(bodies)
    assert billed.prompt_tokens > 0
    # The batch, its ledger entry and the organization's usage all hold the 9 calls.
    assert_billed(batch, *tokens(billed))
    shown = alice.client.get(f"/v1/batches/{batch.public_id}").json()
    assert (shown["usage"]["input_tokens"], shown["usage"]["output_tokens"]) == (
        billed.prompt_tokens,
        billed.completion_tokens,
    )
    assert shown["openrelay"]["unbilled_usage"] is None
    assert org_total(alice) == tokens(billed)
    # Each error line's usage is what its record is billed: its own three calls.
    errors = {line["custom_id"]: line for line in read_lines(batch.error_file)}
    for i in range(3):
        line = errors[f"req-{i + 1}"]
        assert line["error"]["code"] == "invalid_output"
        assert line["response"]["body"]["openrelay"]["reasks"] == 2
        assert line_usage(line) == tokens(summed(calls_of(sim, f"never {i} ")))
    assert usage_of_lines(errors.values()) == tokens(billed)


def test_a_contract_nothing_passes_with_no_reasks_bills_its_call(alice, model, sim):
    batch = create(alice, [contract_record(f"nothing {i}", {"not": {}}, 0) for i in range(2)])
    run_batch(batch.pk)
    batch.refresh_from_db()
    assert (batch.completed_count, batch.failed_count) == (0, 2)
    bodies = calls_of(sim, "nothing ")
    assert len(bodies) == 2
    assert_billed(batch, *tokens(summed(bodies)))
    assert org_total(alice) == tokens(summed(bodies))


def test_a_reask_refused_by_the_model_keeps_the_first_answer_billed(alice, model, sim):
    # The answer quotes a fault directive (\u005b is "["), so the re-ask that sends it back is answered 400.
    text = 'refused re-ask [[answer_json:{"a": "\\u005b[status:400]]"}]]'
    batch = create(alice, [contract_record(text, NEVER, 2)])
    run_batch(batch.pk)
    batch.refresh_from_db()
    first, reask = calls_of(sim, "refused re-ask")
    assert "[[status:400]]" in reask["messages"][1]["content"]
    billed = summed([first])
    assert_billed(batch, *tokens(billed))
    [line] = read_lines(batch.error_file)
    assert line["response"]["status_code"] == 400 and line["error"] is None
    # The model's refusal is the line's response, with the usage billed for the record.
    assert line["response"]["body"]["error"]["message"]
    assert line_usage(line) == tokens(billed)
    assert line["response"]["body"]["openrelay"] == {"reasks": 1}


def test_a_reask_stopped_at_the_call_limit_keeps_the_first_answer_billed(alice, model, sim, settings):
    settings.OPENRELAY_CALL_TIME_LIMIT_S = 0.5
    text = 'hung re-ask [[answer_json:{"a": "\\u005b[hang]]"}]]'
    batch = create(alice, [contract_record(text, NEVER, 2)])
    run_batch(batch.pk)
    batch.refresh_from_db()
    first, _ = calls_of(sim, "hung re-ask")
    billed = summed([first])
    assert_billed(batch, *tokens(billed))
    [line] = read_lines(batch.error_file)
    assert line["response"] is None and line["error"]["code"] == "request_time_limit"
    assert f"{billed.total_tokens} tokens of the 1 answer before it are billed" in line["error"]["message"]


def tool_record(text, url):
    return {**chat(text), "tools": [WEATHER_TOOL], "openrelay": {"tool_config": {"url": url}}}


def unbilled_cost(usage):
    prices = Prices(PRICE_INPUT, PRICE_CACHED_INPUT, PRICE_OUTPUT, multiplier=Decimal("0.5"))  # a standard batch
    return cost(
        prices,
        prompt_tokens=usage.prompt_tokens,
        cached_tokens=usage.cached_tokens,
        completion_tokens=usage.completion_tokens,
    ).total_nanos


def test_a_tool_loop_failed_mid_loop_bills_nothing_but_shows_and_counts_its_tokens(alice, model, sim, executor):
    executor.answer(status(500))
    batch = create(alice, [tool_record(f"tools fail {i} [[tool_rounds:2]]", executor.url) for i in range(3)])
    run_batch(batch.pk)
    batch.refresh_from_db()
    assert (batch.completed_count, batch.failed_count) == (0, 3)
    bodies = calls_of(sim, "tools fail ")
    assert len(bodies) == 3  # each record's first turn, then its executor failed
    spent = summed(bodies)
    # Billed nothing (batch-api.txt)...
    entry = assert_billed(batch, 0, 0, 0)
    shown = alice.client.get(f"/v1/batches/{batch.public_id}").json()
    assert shown["usage"] is None
    # ...but shown as unbilled, on the batch, in its ledger entry and in the organization's usage.
    unbilled = shown["openrelay"]["unbilled_usage"]
    assert (unbilled["input_tokens"], unbilled["input_tokens_details"]["cached_tokens"]) == (
        spent.prompt_tokens,
        spent.cached_tokens,
    )
    assert (unbilled["output_tokens"], unbilled["total_tokens"]) == (spent.completion_tokens, spent.total_tokens)
    counted = unbilled_cost(spent)
    assert counted == oracle_cost(*tokens(spent))[3] > 0
    assert unbilled["cost"]["total"] == as_usd(counted)
    assert (entry.unbilled_input_tokens, entry.unbilled_cached_tokens, entry.unbilled_output_tokens) == tokens(spent)
    assert entry.unbilled_cost_nanos == counted and entry.total_cost_nanos == 0
    total = alice.client.get(USAGE_URL).json()["total"]
    assert total["cost"]["total"] == as_usd(0)
    assert total["unbilled"]["input_tokens"] == spent.prompt_tokens
    assert total["unbilled"]["output_tokens"] == spent.completion_tokens
    assert total["unbilled"]["cost"]["total"] == as_usd(counted)
    # They count against the monthly budget (tests/guardrails_tests pause a batch on them).
    assert guardrails.organization_spend_nanos(alice.org.pk) == counted
    alice.org.monthly_budget = Decimal("0.01")
    assert guardrails.budget_object(alice.org)["spent"] == as_usd(counted)
