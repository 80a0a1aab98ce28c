"""Results name the catalog model a record asked for, never a deployment.

Two deployments of one model may call it by different upstream names; a
batch's lines must not mix them, and neither they nor a deployment's URL may
reach a result file, an API answer or the dashboard.
"""

import orjson
from aiohttp import web

from batches.engine.runner import run_batch
from batches.presenters import batch_object
from openrelay.core.models import Deployment
from openrelay.simulator.server import AppThread
from tests.helpers import MODEL, chat, make_batch, read_lines


def files_text(batch):
    return orjson.dumps(read_lines(batch.output_file) + read_lines(batch.error_file)).decode()


def test_every_output_body_names_the_catalog_model_whichever_deployment_answered(alice, model, sim):
    Deployment.objects.create(model=model, base_url=sim.base_url, upstream_model="sim-upstream-b", max_concurrency=16)
    batch = make_batch(alice.org, [chat(f"hello {i}") for i in range(40)])
    run_batch(batch.pk)
    batch.refresh_from_db()

    asked = {body["model"] for body in sim.bodies("/v1/chat/completions")}
    assert asked == {"sim-upstream", "sim-upstream-b"}  # both deployments answered
    assert {line["response"]["body"]["model"] for line in read_lines(batch.output_file)} == {MODEL}
    assert "sim-upstream" not in files_text(batch)


def test_completions_and_embeddings_name_the_catalog_model(alice, model, sim):
    completions = make_batch(alice.org, [{"model": MODEL, "prompt": "once"}], endpoint="/v1/completions")
    embeddings = make_batch(alice.org, [{"model": MODEL, "input": "a text"}], endpoint="/v1/embeddings")
    for batch in (completions, embeddings):
        run_batch(batch.pk)
        batch.refresh_from_db()
        assert [line["response"]["body"]["model"] for line in read_lines(batch.output_file)] == [MODEL]


def test_an_upstream_error_quoting_its_model_name_names_the_catalog_model(alice, model, sim):
    batch = make_batch(alice.org, [chat("which model? [[status:404]]")])
    run_batch(batch.pk)
    batch.refresh_from_db()

    [line] = read_lines(batch.error_file)
    assert line["response"]["status_code"] == 404
    assert f"`{MODEL}`" in line["response"]["body"]["error"]["message"]
    assert "sim-upstream" not in files_text(batch)


def quoting_server():
    """A model server (a proxy, say) whose answers quote its own URL and the upstream name."""

    async def answer(request):
        body = await request.json()
        own = f"http://{request.host}/v1"
        if "fail" in orjson.dumps(body).decode():
            text = f"Upstream {body['model']} at {own}/chat/completions ({request.host}) refused the request."
            return web.json_response(
                {
                    "error": {
                        "message": text,
                        "type": "invalid_request_error",
                        "param": None,
                        "code": None,
                        "detail": [own, body["model"]],
                    }
                },
                status=400,
            )
        if "html" in orjson.dumps(body).decode():
            return web.Response(text=f"<h1>422</h1><p>{request.host} cannot serve {body['model']}</p>", status=422)
        return web.json_response(
            {
                "id": "x",
                "object": "chat.completion",
                "model": f"/models/{body['model']}.gguf",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            }
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    return AppThread(app, name="quoting")


def test_deployment_urls_and_upstream_names_never_reach_the_result_files_or_the_api(alice, model):
    with quoting_server() as server:
        Deployment.objects.filter(model=model).update(base_url=f"{server.url}/v1", upstream_model="tiny-llama")
        batch = make_batch(alice.org, [chat("fine"), chat("please fail"), chat("send html")])
        run_batch(batch.pk)
    batch.refresh_from_db()

    text = files_text(batch) + orjson.dumps(batch_object(batch)).decode()
    host = server.url.removeprefix("http://")
    assert "tiny-llama" not in text and host not in text
    [output] = read_lines(batch.output_file)
    assert output["response"]["body"]["model"] == MODEL
    errors = {line["custom_id"]: line["response"]["body"]["error"] for line in read_lines(batch.error_file)}
    assert errors["req-2"]["message"] == f"Upstream {MODEL} at the model server (the model server) refused the request."
    assert errors["req-2"]["detail"] == ["the model server", MODEL]
    assert MODEL in errors["req-3"]["message"]


def test_a_members_dashboard_never_shows_the_upstream_name_or_the_deployment(
    alice, model, sim, client, django_user_model
):
    from openrelay.core.models import Membership

    user = django_user_model.objects.create_user("alice", password="pw-for-tests")
    Membership.objects.create(user=user, organization=alice.org)
    client.force_login(user)
    batch = make_batch(alice.org, [chat("fine"), chat("gone [[status:404]]")])
    run_batch(batch.pk)

    pages = [
        client.get(f"/batches/{batch.public_id}"),
        client.get("/"),
        client.get(f"/batches/{batch.public_id}/so_far.jsonl"),
        client.get(f"/batches/{batch.public_id}/so_far.jsonl?kind=error"),
    ]
    text = "".join(
        b"".join(page.streaming_content).decode() if page.streaming else page.content.decode() for page in pages
    )
    assert all(page.status_code == 200 for page in pages)
    assert MODEL in text and "sim-upstream" not in text and sim.base_url.removeprefix("http://") not in text


def test_the_catalog_routes_never_name_a_deployment(alice, model):
    Deployment.objects.filter(model=model).update(base_url="http://gpu-7.internal:8000/v1", upstream_model="tiny-llama")
    answers = [alice.client.get("/v1/models"), alice.client.get(f"/v1/models/{MODEL}"), alice.client.get("/v1/limits")]
    text = "".join(answer.content.decode() for answer in answers)
    assert all(answer.status_code == 200 for answer in answers)
    assert MODEL in text and "gpu-7" not in text and "tiny-llama" not in text
