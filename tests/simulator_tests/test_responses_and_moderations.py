"""The simulator's /v1/responses and /v1/moderations, over HTTP, as the openai SDK reads them."""

import httpx
import openai

from openrelay.simulator.answers import count_tokens


def test_it_answers_a_response_with_usage_in_the_responses_shape(sim):
    client = openai.OpenAI(base_url=sim.base_url, api_key="unused", max_retries=0)

    response = client.responses.create(model="m", input="What is batching?", instructions="Be brief.")

    assert (response.object, response.status, response.model) == ("response", "completed", "m")
    assert response.output_text == "Simulated response to: What is batching?"
    usage = response.usage
    assert usage.input_tokens == count_tokens("Be brief.\nWhat is batching?")
    assert usage.output_tokens == count_tokens(response.output_text)
    assert usage.output_tokens_details.reasoning_tokens == 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens


def test_reasoning_effort_adds_reasoning_tokens_and_a_cap_makes_it_incomplete(sim):
    items = [{"role": "user", "content": [{"type": "input_text", "text": "word " * 300}]}]
    body = httpx.post(
        f"{sim.base_url}/responses",
        json={"model": "m", "input": items, "reasoning": {"effort": "high"}, "max_output_tokens": 2},
    ).json()

    assert [item["type"] for item in body["output"]] == ["reasoning", "message"]
    assert (body["status"], body["incomplete_details"]) == ("incomplete", {"reason": "max_output_tokens"})
    usage = body["usage"]
    assert usage["output_tokens"] == 2 + 256 and usage["output_tokens_details"]["reasoning_tokens"] == 256
    assert usage["input_tokens_details"]["cached_tokens"] == (usage["input_tokens"] // 2) // 64 * 64 > 0


def test_a_response_it_cannot_give_is_a_400(sim):
    for body, param in (
        ({"model": "m"}, "input"),
        ({"model": "m", "input": "x", "stream": True}, "stream"),
        ({"model": "m", "input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
    ):
        answer = httpx.post(f"{sim.base_url}/responses", json=body)
        assert answer.status_code == 400 and answer.json()["error"]["param"] == param


def test_it_moderates_each_input_and_reports_no_usage(sim):
    client = openai.OpenAI(base_url=sim.base_url, api_key="unused", max_retries=0)

    moderation = client.moderations.create(model="m", input=["one", "two", "three"])

    assert len(moderation.results) == 3 and not any(result.flagged for result in moderation.results)
    assert all(
        score < 0.01 for score in moderation.results[0].category_scores.model_dump().values() if score is not None
    )
    raw = httpx.post(f"{sim.base_url}/moderations", json={"model": "m", "input": "one"}).json()
    assert "usage" not in raw and raw["results"][0]["category_scores"] == moderation.results[
        0
    ].category_scores.model_dump(by_alias=True, exclude_none=True)


def test_fault_directives_work_on_both(sim):
    for path, body in (("responses", {"input": "x [[status:503]]"}), ("moderations", {"input": "x [[status:503]]"})):
        assert httpx.post(f"{sim.base_url}/{path}", json={"model": "m", **body}).status_code == 503


def test_every_endpoint_body_validates_against_the_sdks_own_types(sim):
    """A user who checks output lines with the openai SDK's models gets no error from the simulator's bodies."""
    from openai.types import Completion, CreateEmbeddingResponse, ModerationCreateResponse
    from openai.types.chat import ChatCompletion
    from openai.types.responses import Response

    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    for path, body, kind in (
        ("chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, ChatCompletion),
        ("completions", {"prompt": "hi"}, Completion),
        ("embeddings", {"input": ["a", "b"]}, CreateEmbeddingResponse),
        ("responses", {"input": "hi", "reasoning": {"effort": "low"}}, Response),
        ("moderations", {"input": [{"type": "text", "text": "text"}, image]}, ModerationCreateResponse),
    ):
        answer = httpx.post(f"{sim.base_url}/{path}", json={"model": "m", **body})
        assert answer.status_code == 200, answer.text
        kind.model_validate(answer.json())  # raises on a missing or mistyped field

    applied = httpx.post(
        f"{sim.base_url}/moderations", json={"model": "m", "input": [{"type": "text", "text": "text"}, image]}
    ).json()
    text_types, image_types = (result["category_applied_input_types"] for result in applied["results"])
    assert set(map(tuple, text_types.values())) == {("text",)}
    assert image_types["violence"] == ["image"] and image_types["hate"] == []
