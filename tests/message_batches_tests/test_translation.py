"""The Messages <-> chat completions translation (batches.engine.calls.messages) and the usage it bills."""

from batches.engine.calls import messages
from batches.engine.calls.usage import Usage


def test_it_translates_system_blocks_tools_and_results():
    body = {
        "model": "m",
        "max_tokens": 100,
        "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
        "temperature": 0.2,
        "top_k": 5,
        "stop_sequences": ["END"],
        "metadata": {"user_id": "u-1"},
        "thinking": {"type": "enabled", "budget_tokens": 1000},
        "tools": [
            {"name": "weather", "description": "The weather", "input_schema": {"type": "object"}},
            {"type": "web_search_20250305", "name": "web_search"},
        ],
        "tool_choice": {"type": "tool", "name": "weather", "disable_parallel_tool_use": True},
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Weather?"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAA"}},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "s"},
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "Sunny"}]},
                    {"type": "text", "text": "Thanks"},
                ],
            },
        ],
    }
    chat = messages.chat_request(body)
    assert chat == {
        "model": "m",
        "max_tokens": 100,
        "temperature": 0.2,
        "top_k": 5,
        "stop": ["END"],
        "user": "u-1",
        "tools": [
            {
                "type": "function",
                "function": {"name": "weather", "parameters": {"type": "object"}, "description": "The weather"},
            }
        ],
        "tool_choice": {"type": "function", "function": {"name": "weather"}},
        "parallel_tool_calls": False,
        "messages": [
            {"role": "system", "content": "Be brief.\n\nBe kind."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Weather?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA"}},
                ],
            },
            {
                "role": "assistant",
                "content": "Let me look.",
                "tool_calls": [
                    {
                        "id": "toolu_1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city":"Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny"},
            {"role": "user", "content": "Thanks"},
        ],
    }


def test_tool_choice_any_and_errors_in_tool_results():
    chat = messages.chat_request(
        {
            "model": "m",
            "tools": [{"name": "t", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any"},
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "x", "content": "boom", "is_error": True}],
                }
            ],
        }
    )
    assert chat["tool_choice"] == "required"
    assert chat["messages"] == [{"role": "tool", "tool_call_id": "x", "content": "Error: boom"}]


def _chat(message, finish_reason, usage=None, **choice):
    return {
        "id": "chatcmpl-abc",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, **choice}],
        "usage": usage
        or {"prompt_tokens": 300, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 128}},
    }


def test_it_translates_answers_back_with_stop_reasons_and_usage():
    answer = messages.message_answer(_chat({"role": "assistant", "content": "Hi"}, "stop"), "asked")
    assert answer == {
        "id": "msg_abc",
        "type": "message",
        "role": "assistant",
        "model": "asked",
        "content": [{"type": "text", "text": "Hi"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 172,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 128,
            "output_tokens": 7,
            "service_tier": "batch",
        },
    }
    # The same usage as the chat answer's: billing sees no difference between the two shapes.
    assert Usage.from_body(answer) == Usage.from_body(_chat({"role": "assistant", "content": "Hi"}, "stop"))
    assert messages.message_answer(_chat({"content": "Hi"}, "length"), "a")["stop_reason"] == "max_tokens"
    assert messages.message_answer(_chat({"content": ""}, "content_filter"), "a")["stop_reason"] == "refusal"
    matched = messages.message_answer(_chat({"content": "x"}, "stop", stop_reason="END"), "a", ["END"])
    assert (matched["stop_reason"], matched["stop_sequence"]) == ("stop_sequence", "END")
    # vLLM's parsers may say "stop" for a tool call: the tool_use block decides.
    tool = messages.message_answer(
        _chat(
            {"content": None, "tool_calls": [{"id": "c1", "function": {"name": "t", "arguments": '{"a": 1}'}}]}, "stop"
        ),
        "a",
    )
    assert tool["stop_reason"] == "tool_use"
    assert tool["content"] == [{"type": "tool_use", "id": "c1", "name": "t", "input": {"a": 1}}]
    assert messages.message_answer({"choices": []}, "a") is None


def test_cache_writes_bill_as_input():
    body = {
        "type": "message",
        "content": [{"type": "text", "text": "x"}],
        "usage": {
            "input_tokens": 10,
            "cache_creation_input_tokens": 50,
            "cache_read_input_tokens": 100,
            "output_tokens": 5,
        },
    }
    assert Usage.from_body(body) == Usage(prompt_tokens=160, cached_tokens=100, completion_tokens=5)
