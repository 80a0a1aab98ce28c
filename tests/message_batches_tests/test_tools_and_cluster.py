"""Message records with OpenRelay's tool loop (tool_use -> executor -> tool_result), and a Message
Batch run end to end by a real worker cluster."""

import time

import pytest

from batches.engine.runner import run_batch
from batches.models import Batch, Record
from tests.message_batches_tests.conftest import NATIVE, TRANSLATED, request

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def results_by_id(claude, message_batch_id):
    return {r.custom_id: r.result for r in claude.messages.batches.results(message_batch_id)}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("model", [TRANSLATED, NATIVE])
def test_a_tool_record_loops_on_tool_use(claude, translated, native, sim, executor, settings, model):
    settings.OPENRELAY_ALLOW_PRIVATE_URLS = True  # the executor listens on 127.0.0.1
    tool_config = {"url": executor.url, "authorization": "Bearer tool-secret"}
    created = claude.messages.batches.create(
        requests=[
            request(
                "tools",
                "Weather twice [[tool_rounds:2]]",
                model=model,
                tools=[WEATHER],
                openrelay={"tool_config": tool_config},
            ),
            request("asks", "Weather once", model=model, tools=[WEATHER]),
        ]
    )
    run_batch(Batch.objects.get(public_id=created.id.replace("msgbatch_", "batch_")).pk)

    results = results_by_id(claude, created.id)
    looped = results["tools"]
    assert looped.type == "succeeded", looped
    assert looped.message.stop_reason == "end_turn"
    assert looped.message.content[0].text.startswith("Final answer using:")
    assert looped.message.model_extra["openrelay"] == {"tool_rounds": 2}
    # Without a tool_config the model's tool_use is the answer, as Anthropic gives it.
    asked = results["asks"].message
    assert asked.stop_reason == "tool_use" and asked.content[0].type == "tool_use"
    assert asked.content[0].name == "get_weather" and asked.content[0].input == {"city": "sim"}
    assert len(executor.received) == 2  # one call a round
    assert executor.received[0]["json"]["tool_calls"][0]["function"]["name"] == "get_weather"
    # The billed usage is every turn's: the record's counts equal the result's usage.
    record = Record.objects.get(custom_id="tools", batch__public_id=created.id.replace("msgbatch_", "batch_"))
    usage = looped.message.usage
    assert record.completion_tokens == usage.output_tokens
    assert record.prompt_tokens == usage.input_tokens + usage.cache_read_input_tokens
    last_turn = sim.requests()[-1]["body"] if model == NATIVE else None
    if last_turn is not None:
        assert last_turn["messages"][-1]["content"][0]["type"] == "tool_result"


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_real_cluster_runs_a_message_batch(claude, translated, native, clusters):
    created = claude.messages.batches.create(
        requests=[request(f"t{i}", f"Question {i}") for i in range(20)]
        + [request(f"n{i}", f"Question {i}", model=NATIVE) for i in range(5)]
    )
    clusters()  # its engines find the batch by themselves
    deadline = time.monotonic() + 90
    while (batch := claude.messages.batches.retrieve(created.id)).processing_status != "ended":
        assert time.monotonic() < deadline, batch
        time.sleep(0.1)
    assert batch.request_counts.succeeded == 20 and batch.request_counts.errored == 5
    results = results_by_id(claude, created.id)
    assert len(results) == 25
    assert {results[f"t{i}"].type for i in range(20)} == {"succeeded"}
    # A batch runs one model: the first request's; the others are errored as refused.
    assert results["n0"].type == "errored" and "single model" in results["n0"].error.error.message


@pytest.mark.django_db(transaction=True)
def test_the_dashboard_shows_a_message_batch_with_its_anthropic_id(
    claude, alice, translated, client, django_user_model
):
    from openrelay.core.models import Membership

    created = claude.messages.batches.create(requests=[request("a")])
    user = django_user_model.objects.create_user("alice-user", password="pw")
    Membership.objects.create(user=user, organization=alice.org)
    client.force_login(user)
    page = client.get(f"/batches/{created.id.replace('msgbatch_', 'batch_')}").content.decode()
    assert "/v1/messages" in page and created.id in page
