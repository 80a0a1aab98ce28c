"""The workflow loop (workflows.md), record by record: a real callback server, the simulator as the model."""

from batches.engine.calls.caller import Usage
from tests.fixtures.workflow_callback import Reply
from tests.helpers import MODEL, chat
from tests.workflow_tests.conftest import run_workflow, workflow_body

COMPLETED = {"status": "completed", "output": {"ok": True}}


def usage_of(result):
    usage = result["response"]["body"]["usage"]
    return Usage(usage["prompt_tokens"], 0, usage["completion_tokens"])


def block(usage):
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }


def billed(outcome):
    return (outcome.usage.prompt_tokens, outcome.usage.completion_tokens)


def cont(*requests):
    return {"status": "continue", "requests": [{"id": rid, "body": body} for rid, body in requests]}


# --- step 1 and the callback payload ------------------------------------------


def test_it_posts_the_root_result_after_step_1(sim, callback):
    callback.answer([COMPLETED])
    body = workflow_body(callback.url, context={"invoice": 42})
    run_workflow(sim, body)
    [payload] = callback.payloads
    assert set(payload) == {"custom_id", "context", "step", "results", "usage"}
    assert (payload["custom_id"], payload["context"], payload["step"]) == ("inv-0042", {"invoice": 42}, 1)
    [root] = payload["results"]
    assert set(root) == {"id", "status", "response", "error"}
    assert (root["id"], root["status"], root["error"]) == ("root", "succeeded", None)
    assert set(root["response"]) == {"status_code", "body"}
    assert root["response"]["status_code"] == 200
    assert root["response"]["body"]["object"] == "chat.completion"
    assert "List the line items." in root["response"]["body"]["choices"][0]["message"]["content"]
    assert payload["usage"] == block(usage_of(root))
    assert payload["usage"]["total_tokens"] > 0


def test_it_sends_a_null_context_when_none_is_given(sim, callback):
    callback.answer([COMPLETED])
    run_workflow(sim, workflow_body(callback.url))
    assert callback.payloads[0]["context"] is None


def test_it_completes_with_the_workflow_output_line(sim, callback):
    output = {"line_items": [{"sku": "A-1", "qty": 2}], "note": None}
    callback.answer([{"status": "completed", "output": output}])
    outcome = run_workflow(sim, workflow_body(callback.url))
    root_usage = usage_of(callback.payloads[0]["results"][0])
    assert outcome.succeeded and outcome.status_code == 200
    assert outcome.request_id.startswith("req_")
    assert outcome.body == {
        "object": "openrelay.workflow",
        "status": "completed",
        "output": output,
        "steps": 1,
        "requests": 1,
        "usage": block(root_usage),
    }
    assert (outcome.error_code, outcome.error_message) == ("", "")
    assert billed(outcome) == (root_usage.prompt_tokens, root_usage.completion_tokens)


def test_it_completes_with_any_json_output_or_none(sim, callback):
    callback.answer([{"status": "completed", "output": "just a string"}])
    assert run_workflow(sim, workflow_body(callback.url)).body["output"] == "just a string"
    callback.answer([{"status": "completed"}])
    assert run_workflow(sim, workflow_body(callback.url)).body["output"] is None


# --- continue -----------------------------------------------------------------


def test_it_runs_a_steps_requests_concurrently(sim, callback):
    callback.answer(
        [
            cont(*((f"p{i}", chat(f"page {i} [[latency:1000]]")) for i in range(3))),
            COMPLETED,
        ]
    )
    outcome = run_workflow(sim, workflow_body(callback.url, context=["ctx"]))
    first, second = callback.calls
    step_took = second.received_at - first.answered_at
    # One after another they take 3 s; together 1 s, and the bound leaves a loaded machine room.
    assert 1.0 <= step_took < 2.5, f"three 1 s requests took {step_took:.3f}s: not concurrent"
    assert [p["step"] for p in callback.payloads] == [1, 2]
    assert [p["context"] for p in callback.payloads] == [["ctx"], ["ctx"]]
    results = second.payload["results"]
    assert [r["id"] for r in results] == ["p0", "p1", "p2"]
    assert all(r["status"] == "succeeded" and r["error"] is None for r in results)
    assert [r["response"]["body"]["choices"][0]["message"]["content"] for r in results] == [
        f"Simulated answer to: page {i}" for i in range(3)
    ]
    # usage on a callback is cumulative for the record
    total = usage_of(first.payload["results"][0])
    for result in results:
        total += usage_of(result)
    assert second.payload["usage"] == block(total)
    assert outcome.body["steps"] == 2 and outcome.body["requests"] == 4
    assert outcome.body["usage"] == block(total)
    assert billed(outcome) == (total.prompt_tokens, total.completion_tokens)


def test_a_request_for_another_model_comes_back_as_model_mismatch(sim, callback):
    callback.answer([cont(("other", {**chat("hello"), "model": "someone/else"}), ("same", chat("fine"))), COMPLETED])
    outcome = run_workflow(sim, workflow_body(callback.url))
    other, same = callback.payloads[1]["results"]
    assert (other["id"], other["status"], other["response"]) == ("other", "failed", None)
    assert other["error"]["code"] == "model_mismatch"
    assert "someone/else" in other["error"]["message"] and MODEL in other["error"]["message"]
    assert same["status"] == "succeeded"
    assert len(sim.bodies("/v1/chat/completions")) == 2  # root and "same": the mismatch never reached the model
    assert outcome.succeeded


def test_a_request_without_a_model_is_a_model_mismatch(sim, callback):
    unnamed = {"messages": [{"role": "user", "content": "hi"}]}
    callback.answer([cont(("p1", unnamed)), COMPLETED])
    run_workflow(sim, workflow_body(callback.url))
    assert callback.payloads[1]["results"][0]["error"]["code"] == "model_mismatch"


def test_a_request_stopped_at_the_call_limit_is_a_failed_result_and_the_record_goes_on(sim, callback):
    callback.answer([cont(("slow", chat("wait [[hang]]")), ("quick", chat("fast"))), COMPLETED])
    outcome = run_workflow(sim, workflow_body(callback.url), time_limit_s=0.5)
    slow, quick = callback.payloads[1]["results"]
    assert (slow["status"], slow["response"]) == ("failed", None)
    assert slow["error"]["code"] == "request_time_limit"
    assert slow["error"]["message"]
    assert quick["status"] == "succeeded"
    assert outcome.succeeded and outcome.body["requests"] == 3
    # the stopped request is not billed
    expected = usage_of(callback.payloads[0]["results"][0]) + usage_of(quick)
    assert billed(outcome) == (expected.prompt_tokens, expected.completion_tokens)


def test_an_upstream_4xx_is_a_failed_result_with_the_response(sim, callback):
    callback.answer([cont(("bad", chat("nope [[status:400]]"))), COMPLETED])
    outcome = run_workflow(sim, workflow_body(callback.url))
    [bad] = callback.payloads[1]["results"]
    assert bad["status"] == "failed"
    assert bad["response"]["status_code"] == 400
    assert bad["response"]["body"]["error"]["type"] == "invalid_request_error"
    assert bad["error"]["code"] == "upstream_error"
    assert "400" in bad["error"]["message"]
    assert callback.payloads[1]["usage"] == callback.payloads[0]["usage"]  # a failed request adds nothing
    assert outcome.succeeded


def test_a_failed_root_still_goes_to_the_callback(sim, callback):
    callback.answer([COMPLETED])
    outcome = run_workflow(sim, workflow_body(callback.url, content="broken [[status:422]]"))
    [root] = callback.payloads[0]["results"]
    assert (root["id"], root["status"], root["response"]["status_code"]) == ("root", "failed", 422)
    assert callback.payloads[0]["usage"] == {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    assert outcome.succeeded and outcome.usage == Usage()


def test_it_strips_openrelay_from_every_body_the_model_sees(sim, callback):
    nested = {**chat("nested"), "openrelay": {"workflow": {"url": callback.url}}}
    callback.answer([cont(("p1", nested)), COMPLETED])
    run_workflow(sim, workflow_body(callback.url, context={"secret": "ctx"}))
    bodies = sim.bodies("/v1/chat/completions")
    assert len(bodies) == 2
    assert all("openrelay" not in body for body in bodies)
    assert all(body["model"] == "sim-upstream" for body in bodies)


# --- the callback ends the record ---------------------------------------------


def test_a_failed_answer_fails_the_record_with_its_message(sim, callback):
    callback.answer([cont(("p1", chat("one more"))), {"status": "failed", "error": {"message": "Invoice is void."}}])
    outcome = run_workflow(sim, workflow_body(callback.url))
    assert not outcome.succeeded and outcome.status_code is None and outcome.body is None
    assert (outcome.error_code, outcome.error_message) == ("workflow_failed", "Invoice is void.")


def test_a_failed_answer_without_a_message_gets_one(sim, callback):
    callback.answer([{"status": "failed"}])
    outcome = run_workflow(sim, workflow_body(callback.url))
    assert outcome.error_code == "workflow_failed"
    assert outcome.error_message == "The workflow callback answered 'failed' without an error message."


# --- billing ------------------------------------------------------------------


def test_a_completed_record_bills_every_succeeded_request(sim, callback):
    callback.answer(
        [
            cont(("a", chat("first")), ("b", chat("second [[status:400]]"))),
            cont(("c", chat("third, a longer question to cost more tokens"))),
            COMPLETED,
        ]
    )
    outcome = run_workflow(sim, workflow_body(callback.url))
    succeeded = [r for p in callback.payloads for r in p["results"] if r["status"] == "succeeded"]
    assert [r["id"] for r in succeeded] == ["root", "a", "c"]
    total = sum((usage_of(r) for r in succeeded), Usage())
    assert billed(outcome) == (total.prompt_tokens, total.completion_tokens)
    assert outcome.body["usage"] == block(total) and outcome.body["requests"] == 4
    assert outcome.usage.cached_tokens == sum(
        r["response"]["body"]["usage"]["prompt_tokens_details"]["cached_tokens"] for r in succeeded
    )


def test_a_failed_record_is_billed_too(sim, callback):
    callback.answer(
        [cont(("a", chat("first")), ("b", chat("second"))), {"status": "failed", "error": {"message": "x"}}]
    )
    outcome = run_workflow(sim, workflow_body(callback.url))
    total = sum((usage_of(r) for p in callback.payloads for r in p["results"]), Usage())
    assert outcome.error_code == "workflow_failed"
    assert total.total_tokens > 0
    assert billed(outcome) == (total.prompt_tokens, total.completion_tokens)


# --- limits -------------------------------------------------------------------


def test_max_steps_stops_a_callback_that_keeps_asking(sim, callback):
    callback.answer(lambda payload: cont((f"s{payload['step']}", chat(f"step {payload['step']}"))))
    outcome = run_workflow(sim, workflow_body(callback.url, max_steps=3))
    assert outcome.error_code == "workflow_limit_exceeded"
    assert "max_steps" in outcome.error_message
    assert [p["step"] for p in callback.payloads] == [1, 2, 3]
    assert len(sim.bodies("/v1/chat/completions")) == 3
    assert outcome.usage.total_tokens == callback.payloads[-1]["usage"]["total_tokens"] > 0


def test_the_last_allowed_step_may_still_complete(sim, callback):
    callback.answer([cont(("p1", chat("one"))), COMPLETED])
    outcome = run_workflow(sim, workflow_body(callback.url, max_steps=2))
    assert outcome.succeeded and outcome.body["steps"] == 2


def test_max_requests_is_checked_before_the_step_runs(sim, callback):
    callback.answer([cont(("a", chat("a")), ("b", chat("b")), ("c", chat("c")))])
    outcome = run_workflow(sim, workflow_body(callback.url, max_requests=3))
    assert outcome.error_code == "workflow_limit_exceeded"
    assert "max_requests" in outcome.error_message
    assert len(sim.bodies("/v1/chat/completions")) == 1  # only root ran
    assert outcome.usage.total_tokens == callback.payloads[0]["usage"]["total_tokens"]


def test_max_requests_counts_the_root_and_allows_exactly_the_limit(sim, callback):
    callback.answer([cont(("a", chat("a")), ("b", chat("b")), ("c", chat("c"))), COMPLETED])
    outcome = run_workflow(sim, workflow_body(callback.url, max_requests=4))
    assert outcome.succeeded and outcome.body["requests"] == 4


def test_max_tokens_is_checked_after_each_step(sim, callback):
    callback.answer([cont(("a", chat("a fairly long question " * 5))), COMPLETED])
    root_only = run_workflow(sim, workflow_body(callback.url))
    root_tokens = callback.payloads[0]["usage"]["total_tokens"]
    callback.reset()
    callback.answer([cont(("a", chat("a fairly long question " * 5))), COMPLETED])
    outcome = run_workflow(sim, workflow_body(callback.url, max_tokens=root_tokens))
    assert root_only.succeeded
    assert outcome.error_code == "workflow_limit_exceeded"
    assert "max_tokens" in outcome.error_message
    assert len(callback.payloads) == 1  # step 2 went past the limit: no second callback
    assert outcome.usage.total_tokens > root_tokens  # and what ran is billed


def test_max_tokens_can_stop_the_record_after_step_1(sim, callback):
    callback.answer([COMPLETED])
    outcome = run_workflow(sim, workflow_body(callback.url, max_tokens=1))
    assert outcome.error_code == "workflow_limit_exceeded"
    assert callback.payloads == []
    assert outcome.usage.total_tokens > 1


# --- callback failures --------------------------------------------------------


def test_a_callback_answering_non_2xx_fails_the_record(sim, callback):
    callback.answer([Reply(status=500, raw=b'{"status": "completed"}')])
    outcome = run_workflow(sim, workflow_body(callback.url))
    assert outcome.error_code == "workflow_callback_failed"
    assert "HTTP 500" in outcome.error_message
    assert outcome.usage.total_tokens == callback.payloads[0]["usage"]["total_tokens"] > 0


def test_a_callback_that_times_out_fails_the_record(sim, callback):
    callback.answer([Reply(hang=True)])
    outcome = run_workflow(sim, workflow_body(callback.url, timeout_ms=300))
    assert outcome.error_code == "workflow_callback_failed"
    assert "timed out" in outcome.error_message


def test_a_callback_answering_malformed_json_fails_the_record(sim, callback):
    callback.answer([Reply(raw=b'{"status": "completed", ')])
    outcome = run_workflow(sim, workflow_body(callback.url))
    assert outcome.error_code == "workflow_callback_failed"
    assert "not valid JSON" in outcome.error_message


MALFORMED_ANSWERS = {
    "not an object": ([{"status": "completed"}], "not a JSON object"),
    "unknown status": ({"status": "done"}, "unknown status 'done'"),
    "no status": ({"output": 1}, "unknown status None"),
    "no requests": ({"status": "continue"}, "'requests' must be a non-empty array"),
    "empty requests": ({"status": "continue", "requests": []}, "'requests' must be a non-empty array"),
    "request not an object": ({"status": "continue", "requests": ["p1"]}, "requests[0] must be an object"),
    "body not an object": ({"status": "continue", "requests": [{"id": "p1", "body": "hi"}]}, "requests[0] must"),
    "missing id": ({"status": "continue", "requests": [{"body": chat("x")}]}, "requests[0].id must be a non-empty"),
    "numeric id": ({"status": "continue", "requests": [{"id": 7, "body": chat("x")}]}, "requests[0].id must be"),
    "duplicate id": (cont(("p1", chat("x")), ("p1", chat("y"))), "requests[1].id 'p1' is already used"),
    "root reused": (cont(("root", chat("x"))), "requests[0].id 'root' is already used"),
}


def test_a_malformed_answer_fails_the_record(sim, callback):
    for name, (answer, fragment) in MALFORMED_ANSWERS.items():
        callback.reset()
        callback.answer([answer])
        outcome = run_workflow(sim, workflow_body(callback.url))
        assert outcome.error_code == "workflow_callback_failed", name
        assert "malformed answer" in outcome.error_message and fragment in outcome.error_message, name
        assert outcome.usage.total_tokens > 0, name  # the root is still billed


def test_an_id_is_unique_across_the_whole_record(sim, callback):
    callback.answer([cont(("p1", chat("x"))), cont(("p1", chat("again")))])
    outcome = run_workflow(sim, workflow_body(callback.url))
    assert outcome.error_code == "workflow_callback_failed"
    assert "'p1' is already used" in outcome.error_message
    assert len(sim.bodies("/v1/chat/completions")) == 2


def test_a_private_callback_url_is_refused_by_the_guard(sim, callback):
    callback.answer([COMPLETED])
    outcome = run_workflow(sim, workflow_body(callback.url), allow_private=False)
    assert outcome.error_code == "workflow_callback_failed"
    assert "private, loopback" in outcome.error_message
    assert callback.payloads == []
    assert outcome.usage.total_tokens > 0  # the root ran and is billed


def test_a_callback_that_cannot_be_reached_fails_the_record(sim, callback):
    url = callback.url.replace(f":{callback.port}/", ":9/")  # discard port: nothing listens
    outcome = run_workflow(sim, workflow_body(url))
    assert outcome.error_code == "workflow_callback_failed"
    assert "could not connect" in outcome.error_message


# --- authorization and enabling -----------------------------------------------

TOKEN = "Bearer wf-secret-0123456789abcdef"


def test_it_sends_authorization_as_a_header_on_every_callback(sim, callback):
    callback.answer([cont(("p1", chat("x"))), COMPLETED])
    outcome = run_workflow(sim, workflow_body(callback.url, authorization=TOKEN))
    assert [call.headers.get("Authorization") for call in callback.calls] == [TOKEN, TOKEN]
    assert all("Authorization" not in call.payload and TOKEN not in str(call.payload) for call in callback.calls)
    assert TOKEN not in str(outcome)
    assert all("authorization" not in r["headers"] for r in sim.requests())


def test_no_authorization_header_without_authorization(sim, callback):
    callback.answer([COMPLETED])
    run_workflow(sim, workflow_body(callback.url))
    assert "Authorization" not in callback.calls[0].headers


def test_authorization_never_reaches_an_error_message(sim, callback):
    echoes = [
        {"status": "failed", "error": {"message": f"bad header {TOKEN}"}},
        {"status": "failed", "error": {"message": f"token {TOKEN.split()[1]} refused"}},
        {"status": TOKEN},
    ]
    for answer in echoes:
        callback.reset()
        callback.answer([answer])
        outcome = run_workflow(sim, workflow_body(callback.url, authorization=TOKEN))
        assert outcome.error_code in ("workflow_failed", "workflow_callback_failed")
        assert "wf-secret" not in outcome.error_message and "[redacted]" in outcome.error_message


def test_a_record_of_an_organization_without_workflows_fails(sim, callback):
    outcome = run_workflow(sim, workflow_body(callback.url), workflows_enabled=False)
    assert outcome.error_code == "workflow_not_enabled"
    assert sim.bodies() == [] and callback.payloads == []


def test_an_invalid_workflow_fails_the_record_before_any_call(sim, callback):
    outcome = run_workflow(sim, workflow_body(callback.url, max_steps=-1))
    assert outcome.error_code == "invalid_workflow"
    assert sim.bodies() == [] and callback.payloads == []
