"""Contracts that cost only their own record (issue 56, finding 1): schemas whose check would cost too
much are refused at create; a check that still runs long fails its record alone, off the engine's loop."""

import asyncio
import json
import resource
import time
from pathlib import Path

import jsonschema_specifications
import openapi_spec_validator
import orjson
import pytest
from django.test import override_settings

from batches.engine.checks import Checkers, ContractTooCostly
from batches.engine.context import RecordContext
from batches.engine.loops import contract as contracts
from batches.models import Batch
from batches.validation import schema_cost
from batches.validation.contracts import MAX_SCHEMA_DEPTH, MAX_SCHEMA_NODES, Contract, canonical
from tests.contract_tests.conftest import chat_body, create, line, person_format
from tests.contract_tests.hostile import (
    CATASTROPHIC_PATTERN,
    FORMATS_DRAFT7,
    RECURSIVE_FAN_OUT,
    chain,
    deep_refs,
    items_chain,
    nested_answer,
)
from tests.helpers import EngineThread, read_lines, wait_for

SCHEMA_PARAM = "body.openrelay.output_contract.schema"
OPENAPI = Path(openapi_spec_validator.__file__).parent / "resources" / "schemas"
METASCHEMAS = Path(jsonschema_specifications.__file__).parent / "schemas"


def own_contract(schema, max_reasks=0):
    return {"output_contract": {"schema": schema, "max_reasks": max_reasks}}


def rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# --- refused at create ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "schema",
    [chain(16), chain(18), chain(24), chain(16, "allOf"), chain(16, "oneOf"), items_chain(16), chain(12)],
    ids=["anyOf-16", "anyOf-18", "anyOf-24", "allOf-16", "oneOf-16", "items-16", "anyOf-12"],
)
def test_a_schema_whose_walk_doubles_is_refused_at_create_with_its_line_and_param(alice, model, schema):
    before = rss_mb()
    started = time.monotonic()
    answer = create(alice, [line("ok", chat_body("a")), line("bad", chat_body("b", openrelay=own_contract(schema)))])
    assert time.monotonic() - started < 5
    assert rss_mb() - before < 100  # counted, never expanded: the 24-level chain took 4 GB to check
    [error] = answer["errors"]["data"]
    assert (error["code"], error["param"], error["line"]) == ("invalid_output_contract", SCHEMA_PARAM, 2)
    assert f"more than {MAX_SCHEMA_NODES:,} subschemas" in error["message"]
    assert answer["request_counts"]["total"] == 1


def test_a_response_format_and_a_batch_contract_are_refused_the_same_way(alice, model):
    answer = create(alice, [line("r", chat_body("a", response_format=person_format(chain(16, "oneOf"))))])
    [error] = answer["errors"]["data"]
    assert (error["code"], error["param"]) == ("invalid_output_contract", "body.response_format.json_schema.schema")
    answer = create(alice, [line("r", chat_body("a"))], expect=400, openrelay=own_contract(chain(18)))
    assert answer["error"]["code"] == "invalid_output_contract"
    assert answer["error"]["param"] == "openrelay.output_contract.schema"


def test_references_nested_past_the_depth_bound_are_refused(alice, model):
    [error] = create(alice, [line("r", chat_body("a", openrelay=own_contract(deep_refs(100))))])["errors"]["data"]
    assert error["code"] == "invalid_output_contract"
    assert f"nest more than {MAX_SCHEMA_DEPTH} levels deep" in error["message"]


@pytest.mark.parametrize(
    "path",
    [
        OPENAPI / "v2.0" / "schema.json",
        OPENAPI / "v3.0" / "schema.json",
        OPENAPI / "v3.1" / "schema.json",
        METASCHEMAS / "draft202012" / "metaschema.json",
        METASCHEMAS / "draft7" / "metaschema.json",
    ],
    ids=lambda p: "/".join(p.parts[-2:]),
)
def test_real_world_schemas_pass_the_budget(path):
    schema = json.loads(path.read_text())
    schema.pop("$schema", None)  # checked under 2020-12: the drafts' own meta-schema refs are remote
    cost = schema_cost.cost(schema, MAX_SCHEMA_NODES, MAX_SCHEMA_DEPTH)
    assert cost.nodes <= MAX_SCHEMA_NODES // 2, cost  # room to spare


def test_the_count_is_exact_on_the_chain_and_linear_in_the_schema():
    assert schema_cost.cost(chain(10), 10**9, 1000).nodes == 2**12 - 2  # 2^(n+2) - 2
    started = time.monotonic()
    assert schema_cost.cost(chain(40), 10**30, 1000).nodes == 2**42 - 2  # counted in 40 steps, not 2^42
    with pytest.raises(schema_cost.TooCostly, match="nest more than"):
        schema_cost.cost(chain(300), 10**100, MAX_SCHEMA_DEPTH)
    assert time.monotonic() - started < 10  # the walk of 2^42 would never end: the bound is a loaded machine's
    assert schema_cost.cost(RECURSIVE_FAN_OUT, MAX_SCHEMA_NODES, MAX_SCHEMA_DEPTH).recursive


# --- checked off the loop, under the time limit ---------------------------------------------


def checked(schema, text, time_limit_s=5.0, checkers=None):
    """contract.check of one chat answer `text` against `schema`, with real checker processes."""
    contract = Contract(canonical(schema, "c", "p"), 0, "record")
    body = {"choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}

    async def go():
        pool = checkers or Checkers(2, time_limit_s, 1024**3)
        ctx = RecordContext(1, "batch_x", 7, contracts.CHAT, "m", caller=None, checkers=pool)
        try:
            return await contracts.check(ctx, contract, body, contracts.CHAT)
        finally:
            await pool.close()

    return asyncio.run(go())


def test_a_check_past_the_time_limit_raises_and_the_next_check_gets_a_new_checker():
    pool = Checkers(1, 0.5, 1024**3)

    async def go():
        ctx = RecordContext(1, "batch_x", 7, contracts.CHAT, "m", caller=None, checkers=pool)
        slow = Contract(canonical(RECURSIVE_FAN_OUT, "c", "p"), 0, "record")
        body = {"choices": [{"message": {"content": nested_answer(20)}}]}
        started = time.monotonic()
        with pytest.raises(ContractTooCostly, match="took more than 0.5 s"):
            await contracts.check(ctx, slow, body, contracts.CHAT)
        took = time.monotonic() - started
        quick = {"choices": [{"message": {"content": '{"name": 1, "age": 0}'}}]}
        person = Contract(canonical({"properties": {"name": {"type": "string"}}}, "c", "p"), 0, "record")
        errors = await contracts.check(ctx, person, quick, contracts.CHAT)
        await pool.close()
        return took, errors

    took, errors = asyncio.run(go())
    assert 0.5 <= took < 10  # cut at its 0.5 s limit; the rest is a loaded machine's killing and raising
    assert errors == ['$.name: 1 is not of type "string"']


def test_a_catastrophic_pattern_is_bounded_by_the_backtracking_limit():
    answer = orjson.dumps(["a" * 40 + "!"] * 200).decode()
    started = time.monotonic()
    errors = checked(CATASTROPHIC_PATTERN, answer)
    # Its 5 s limit would cut an unbounded search (an error, not these 5): the bound only catches a
    # hang, with room for a loaded machine starting the checker processes.
    assert time.monotonic() - started < 15
    assert len(errors) == 5 and all(e.startswith("$[") for e in errors)


def test_formats_are_asserted_under_draft_7_and_checked_quickly():
    answer = orjson.dumps(["(" * 5000, "a@" + "b" * 5000, "x" * 20000] * 10).decode()
    started = time.monotonic()
    errors = checked(FORMATS_DRAFT7, answer)
    assert time.monotonic() - started < 15  # as above: its 5 s limit tells a slow check
    assert errors and len(errors) <= 5


def test_a_passing_answer_against_a_normal_schema_stays_inline():
    person = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    pool = Checkers(1, 5.0, 1024**3)
    assert checked(person, '{"name": "sim"}', checkers=pool) == []
    assert pool.started == 0 and not pool.idle  # no process was needed


# --- one engine, two organizations ------------------------------------------------------------


@override_settings(OPENRELAY_CONTRACT_CHECK_TIME_LIMIT_S=0.5)
def test_a_costly_check_fails_its_record_alone_while_another_organizations_batch_runs(alice, bob, model):
    hostile = chat_body(
        f"[[answer_json:{nested_answer(20)}]]", openrelay={"output_contract": {"schema": RECURSIVE_FAN_OUT}}
    )
    bad = create(alice, [line(f"h{i}", hostile) for i in range(4)])
    assert bad["errors"] is None
    with EngineThread():
        started = time.monotonic()
        plain = create(bob, [line(f"p{i}", chat_body(f"hello {i}")) for i in range(20)])
        took = wait_for(lambda: Batch.objects.get(public_id=plain["id"]).status == "completed", 30, "bob's plain batch")
        wait_for(lambda: Batch.objects.get(public_id=bad["id"]).status == "completed", 60, "alice's batch")
    assert took < 5, took
    assert time.monotonic() - started < 60
    bob_batch, alice_batch = Batch.objects.get(public_id=plain["id"]), Batch.objects.get(public_id=bad["id"])
    assert (bob_batch.completed_count, bob_batch.failed_count) == (20, 0)
    errors = read_lines(alice_batch.error_file)
    assert [e["error"]["code"] for e in errors] == ["output_contract_too_costly"] * 4
    assert "took more than 0.5 s" in errors[0]["error"]["message"]
    # Its answers were made, so they are billed, as an invalid_output's are (finding 2).
    assert alice_batch.input_tokens > 0 and alice_batch.output_tokens > 0
