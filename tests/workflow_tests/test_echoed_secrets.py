"""A workflow callback that echoes the Authorization value it received (whole, re-cased or a piece
of it) in its error message (anywhere around the 2,000-character cut), a request id, its status,
a request's model or body, its output, an HTTP error's body or a header: no piece of it reaches
the record's outcome."""

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.echoes import assert_no_piece, echoes
from tests.fixtures.workflow_callback import Reply
from tests.helpers import chat
from tests.workflow_tests.conftest import run_workflow, workflow_body

POSITIONS = ["error message", "duplicate id", "status", "model", "output", "request body", "http error body", "header"]


def _script(position, echoed, padding):
    def answer(payload):
        if position == "error message":
            return {"status": "failed", "error": {"code": "bad", "message": "x" * padding + echoed + " refused"}}
        if position == "duplicate id":
            return (
                {"status": "continue", "requests": [{"id": "root", "body": chat("again")}]}
                if padding % 2
                else {
                    "status": "continue",
                    "requests": [{"id": echoed, "body": chat("a")}, {"id": echoed, "body": chat("b")}],
                }
            )
        if position == "status":
            return {"status": f"done-{echoed}"}
        if position == "model":
            return {"status": "continue", "requests": [{"id": "r1", "body": {**chat("a"), "model": echoed}}]}
        if position == "request body" and payload["step"] == 1:
            return {"status": "continue", "requests": [{"id": "r1", "body": chat(f"say {echoed}")}]}
        if position == "request body":
            return {"status": "completed", "output": payload["results"]}
        if position == "http error body":
            return Reply(status=401, raw=orjson.dumps({"error": {"message": f"bad credentials: {echoed}"}}))
        if position == "header":
            answer = {"status": "completed", "output": "done"} if padding % 2 else {"status": "nope"}
            return Reply(raw=orjson.dumps(answer), headers={"X-Echo": echoed, "WWW-Authenticate": echoed})
        return {"status": "completed", "output": {"echo": [echoed], echoed: 1}}

    return answer


def _outcome_text(outcome):
    return orjson.dumps(vars(outcome), default=str).decode()


def test_the_review_finding_a_token_placed_across_the_2000_character_cut(sim, callback):
    token = "wf-SECRET-b6e0d1-0123ab"
    callback.answer(_script("error message", token, 2000 - len("x") - 20))
    outcome = run_workflow(sim, workflow_body(callback.url, authorization=f"Bearer {token}"))
    assert outcome.error_code == "workflow_failed"
    assert_no_piece(outcome.error_message, token)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(echoes(), st.sampled_from(POSITIONS), st.integers(1900, 2100))
def test_no_piece_of_the_credential_comes_back_from_the_callback(sim, callback, echo, position, padding):
    authorization, token, echoed = echo
    callback.answer(_script(position, echoed, padding))
    outcome = run_workflow(sim, workflow_body(callback.url, authorization=authorization))
    assert_no_piece(_outcome_text(outcome), authorization, token)
