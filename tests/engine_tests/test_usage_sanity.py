"""Usage a server reports that cannot be right is billed as reported, and counted on the batch."""

import orjson
from aiohttp import web
from django.urls import reverse

from batches.engine.calls.usage import Usage
from batches.engine.runner import run_batch
from openrelay.core.models import Deployment
from openrelay.simulator.server import AppThread
from tests.helpers import chat, make_batch, read_lines

# What a real server said (llama.cpp answered n: 2 with one choice's tokens), and worse.
USAGES = {
    "fine": {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9},
    "two choices, one token": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    "no usage": None,
    "more cached than sent": {
        "prompt_tokens": 5,
        "completion_tokens": 4,
        "total_tokens": 9,
        "prompt_tokens_details": {"cached_tokens": 9},
    },
    "no input": {"prompt_tokens": 0, "completion_tokens": 4, "total_tokens": 4},
}


def careless_server():
    async def answer(request):
        body = await request.json()
        case = body["messages"][0]["content"]
        n = body.get("n", 1)
        choices = [
            {"index": i, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"} for i in range(n)
        ]
        answer = {"id": "x", "object": "chat.completion", "model": body["model"], "choices": choices}
        if USAGES[case] is not None:
            answer["usage"] = USAGES[case]
        return web.json_response(answer)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    return AppThread(app, name="careless")


def test_records_with_impossible_usage_are_kept_billed_as_reported_and_counted(alice, model, admin_client):
    with careless_server() as server:
        Deployment.objects.filter(model=model).update(base_url=f"{server.url}/v1")
        bodies = [chat(case, **({"n": 2} if case == "two choices, one token" else {})) for case in USAGES]
        batch = make_batch(alice.org, bodies)
        run_batch(batch.pk)
    batch.refresh_from_db()

    assert (batch.status, batch.completed_count) == ("completed", len(USAGES))
    assert len(read_lines(batch.output_file)) == len(USAGES)
    assert batch.implausible_usage_count == 4
    # Billed exactly as reported (cached tokens are capped at the prompt's when priced, not when counted).
    assert (batch.input_tokens, batch.cached_tokens, batch.output_tokens) == (15, 9, 13)
    answer = alice.client.get(f"/v1/batches/{batch.public_id}").json()
    assert answer["openrelay"]["implausible_usage"] == 4
    page = admin_client.get(reverse("admin:batches_batch_changelist")).content.decode()
    assert "implausible usage" in page.lower()


def test_the_rules_read_every_shape():
    chat_two = {"object": "chat.completion", "choices": [{}, {}], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
    assert Usage.from_body(chat_two).implausible == 0
    response = {"object": "response", "output": [{"type": "message"}], "usage": {"input_tokens": 3, "output_tokens": 0}}
    assert Usage.from_body(response).implausible == 1
    reasoning = {
        "object": "response",
        "output": [{}, {}],
        "usage": {"input_tokens": 3, "output_tokens": 10, "output_tokens_details": {"reasoning_tokens": 11}},
    }
    assert Usage.from_body(reasoning).implausible == 1
    embeddings = {"object": "list", "data": [{}], "usage": {"prompt_tokens": 3, "total_tokens": 3}}
    assert Usage.from_body(embeddings) == Usage(prompt_tokens=3)
    assert Usage.from_body({"id": "modr-1", "results": [{}]}) == Usage()  # moderations report none
    assert Usage.from_body([1, 2]).implausible == 1
    assert orjson.dumps(Usage.from_body(chat_two).as_openai())  # the chat shape, as tool loops write it
