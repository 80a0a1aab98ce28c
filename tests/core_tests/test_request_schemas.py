"""The published request schemas' checks (openrelay.lib.request_schemas): the first field a real server would
refuse, named and worded as OpenAI words its 400s, from the SDKs' own request types; never an exception."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from openrelay.lib import request_schemas
from openrelay.lib.request_schemas import Problem

USER = [{"role": "user", "content": "hi"}]


def _chat(**fields):
    return request_schemas.CHAT.problem({"model": "m", "messages": USER, **fields})


def test_the_issues_cases_are_named_and_worded():
    assert _chat(messages=[{"role": "wizard", "content": "hi"}]) == Problem(
        "messages.0.role",
        "Invalid value for 'messages.0.role': 'wizard'. Supported values are: 'developer', 'system', 'user', "
        "'assistant', 'tool', and 'function'.",
        "invalid_value",
    )
    assert _chat(response_format={"format": {"type": "json_schema"}}) == Problem(
        "response_format.type", "Missing required parameter: 'response_format.type'.", "missing_required_parameter"
    )
    assert _chat(response_format={"type": "banana"}).message.endswith(
        "'banana'. Supported values are: 'text', 'json_schema', and 'json_object'."
    )
    assert _chat(temperature="hot") == Problem(
        "temperature", "Invalid type for 'temperature': expected a number, but got a string instead.", "invalid_type"
    )
    assert _chat(n="two").param == _chat(n="2").param == "n"


def test_nested_members_of_unions_are_told_by_the_member_the_body_meant():
    text_part = _chat(messages=[{"role": "user", "content": [{"type": "text", "text": 5}]}])
    assert (text_part.param, text_part.code) == ("messages.0.content.0.text", "invalid_type")
    number = _chat(messages=[{"role": "user", "content": 5}])
    assert number.message.endswith("expected a string or an array, but got an integer instead.")
    named = _chat(tool_choice={"type": "function", "function": {}})
    assert named.param == "tool_choice.function.name"
    tool = _chat(tools=[{"type": "function", "function": {"name": 5}}])
    assert tool.param == "tools.0.function.name"
    item = request_schemas.RESPONSES.problem({"model": "m", "input": [{"role": "wizard", "content": "x"}]})
    assert item.param == "input.0.role"


def test_unknown_fields_and_nulls_pass_and_the_prefix_is_the_callers():
    assert _chat(top_k=20, chat_template_kwargs={"a": 1}, guided_json={}, temperature=None, tools=None) is None
    assert request_schemas.EMBEDDINGS.problem({"model": "m", "input": "x", "dimensions": "8"}, "body.").param == (
        "body.dimensions"
    )


@pytest.mark.parametrize("schema", ["CHAT", "COMPLETIONS", "EMBEDDINGS", "MODERATIONS", "RESPONSES", "MESSAGES"])
def test_each_endpoint_takes_a_minimal_valid_body(schema):
    bodies = {
        "CHAT": {"model": "m", "messages": USER},
        "COMPLETIONS": {"model": "m", "prompt": "hi"},
        "EMBEDDINGS": {"model": "m", "input": ["a", "b"]},
        "MODERATIONS": {"model": "m", "input": "hi"},
        "RESPONSES": {"model": "m", "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]},
        "MESSAGES": {"model": "m", "max_tokens": 5, "messages": USER},
    }
    assert getattr(request_schemas, schema).problem(bodies[schema]) is None


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["type", "role", "content", "text", "function", "name", "input"]), inner, max_size=3
        )
    ),
    max_leaves=12,
)
KEYS = st.sampled_from(["messages", "response_format", "tools", "tool_choice", "input", "text", "prompt", "n", "stop"])


@settings(max_examples=150, deadline=None)
@given(fields=st.dictionaries(KEYS, JSON, max_size=3))
def test_any_json_gets_a_problem_or_none_never_an_exception(fields):
    for schema in (request_schemas.CHAT, request_schemas.RESPONSES, request_schemas.MESSAGES):
        problem = schema.problem({"model": "m", "max_tokens": 5, **fields})
        assert problem is None or (problem.param and problem.message and problem.code)
