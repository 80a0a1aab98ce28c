"""POST /v1/batches/estimate: create's inputs, create's rejections, a quote whose every figure says how it was made."""

from datetime import timedelta

import pytest
from django.utils import timezone

from batches.engine.runner import run_batch
from batches.models import Batch
from files.models import File
from openrelay.core.models import Price
from tests.batches_api_tests.helpers import upload
from tests.estimate_tests.conftest import line, ok, quote
from tests.helpers import CHAT, MODEL, chat, deploy, make_batch

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_quotes_inline_requests_without_creating_anything(alice, fresh_sim):
    deploy(MODEL, fresh_sim.base_url)
    answer = ok(quote(alice, requests=[line(1), line(2), {"custom_id": "bad"}]))

    assert answer["request_counts"] == {"total": 2, "rejected": 1, "calls": 2}
    assert answer["errors"]["data"][0]["line"] == 3
    assert answer["model"] == MODEL
    assert not Batch.objects.exists() and not File.objects.exists()


def test_its_rejections_are_creates_own(alice, fresh_sim):
    deploy(MODEL, fresh_sim.base_url)
    lines = [line(1), line(1), {"custom_id": "x", "method": "GET", "url": CHAT, "body": chat("x")}, "not json"]
    content = b"\n".join(item.encode() if isinstance(item, str) else __import__("orjson").dumps(item) for item in lines)
    file = upload(alice, content + b"\n")
    quoted = ok(quote(alice, input_file_id=file.public_id))
    created = alice.client.post(
        "/v1/batches", {"endpoint": CHAT, "completion_window": "24h", "input_file_id": file.public_id}, format="json"
    ).json()

    assert quoted["errors"]["data"] == created["errors"]["data"]
    assert quoted["request_counts"]["total"] == created["request_counts"]["total"] == 1


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({"requests": []}, "empty_file"),
        ({"input_file_id": "file-nope"}, "file_not_found"),
        ({"requests": [line(1)], "endpoint": "/v1/nope"}, "invalid_value"),
    ],
)
def test_a_bad_request_gets_creates_error_envelope(alice, fresh_sim, params, code):
    deploy(MODEL, fresh_sim.base_url)
    response = quote(alice, **params)
    assert response.status_code in (400, 404)
    assert response.json()["error"]["code"] == code
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_another_organizations_file_is_not_found(alice, bob, fresh_sim):
    deploy(MODEL, fresh_sim.base_url)
    file = upload(bob, b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n')
    response = quote(alice, input_file_id=file.public_id)
    assert response.json()["error"]["code"] == "file_not_found"


def test_a_server_without_a_tokenizer_is_approximated_and_says_so(alice, fresh_sim):
    deploy(MODEL, fresh_sim.base_url)
    answer = ok(quote(alice, requests=[line(1, "x" * 400)]))

    assert answer["input_tokens"]["method"] == "approximation"
    assert answer["input_tokens"]["total"] == 100
    assert "4 characters a token" in answer["input_tokens"]["note"]
    assert answer["confidence"] == "low"


def test_a_server_down_while_quoting_gives_a_clear_answer(alice, db):
    deploy(MODEL, "http://127.0.0.1:9/v1")  # nothing listens on port 9
    answer = ok(quote(alice, requests=[line(1, "x" * 40, max_tokens=10)]))

    assert answer["input_tokens"]["method"] == "approximation"
    assert "did not answer" in answer["input_tokens"]["note"]
    assert answer["time"]["expected_duration_s"] is None and answer["fits_window"] is None
    assert any("No measured pace" in note for note in answer["notes"])


def test_vllms_tokenize_counts_what_the_run_then_reports(alice, vllm_sim):
    deploy(MODEL, vllm_sim.base_url)
    requests = [line(i, "word " * (i * 7)) for i in range(1, 6)]
    answer = ok(quote(alice, requests=requests))

    asked = vllm_sim.requests("/tokenize")
    assert len(asked) == 5 and asked[0]["body"]["messages"] == requests[0]["body"]["messages"]
    assert asked[0]["body"]["model"] == "sim-upstream"
    assert answer["input_tokens"]["method"] == "vllm_tokenize"
    assert answer["input_tokens"]["error_pct"] == 0

    batch = make_batch(alice.org, [r["body"] for r in requests])
    run_batch(batch.pk)
    batch.refresh_from_db()
    assert answer["input_tokens"]["total"] == batch.input_tokens


def test_llamacpps_input_tokens_route_is_taken_for_chat(alice, llamacpp_sim):
    deploy(MODEL, llamacpp_sim.base_url)
    answer = ok(quote(alice, requests=[line(1, "hello there")]))

    assert answer["input_tokens"]["method"] == "llamacpp_input_tokens"
    [asked] = llamacpp_sim.requests("/v1/chat/completions/input_tokens")
    assert asked["body"]["model"] == "sim-upstream" and "openrelay" not in asked["body"]
    assert llamacpp_sim.requests("/tokenize") == []  # its raw-text /tokenize counts no template


def test_a_big_input_is_sampled_and_the_error_stated(alice, vllm_sim):
    deploy(MODEL, vllm_sim.base_url)
    requests = [line(i, "a fairly ordinary question " * (1 + i % 13)) for i in range(1, 1201)]
    answer = ok(quote(alice, requests=requests))

    counted = answer["input_tokens"]
    assert counted["sampled"] and counted["counted_records"] == 200 and counted["records"] == 1200
    assert len(vllm_sim.requests("/tokenize")) == 200
    exact = sum(-(-len("\n".join([r["body"]["messages"][0]["content"]])) // 4) for r in requests)
    assert abs(counted["total"] - exact) / exact < 0.01
    assert 0 < counted["error_pct"] < 3


def test_a_model_with_no_history_says_its_output_is_a_guess(alice, fresh_sim):
    deploy(MODEL, fresh_sim.base_url)
    answer = ok(quote(alice, requests=[line(1, max_tokens=50), line(2, max_tokens=500)]))

    output = answer["output_tokens"]
    assert output["basis"] == "max_tokens" and output["history_records"] == 0
    assert output["ceiling"] == 550
    assert output["expected"] == 50 + 256  # each record's cap bounds the guess of 256
    assert any("No history" in note for note in answer["notes"])


def test_the_organizations_history_sets_the_output_and_cost(alice, bob, fresh_sim):
    model = deploy(MODEL, fresh_sim.base_url)
    Price.objects.create(model=model, input_per_mtok="1", output_per_mtok="4")
    past = make_batch(alice.org, [chat("[[tokens:40]] go") for _ in range(20)])
    run_batch(past.pk)
    bobs = make_batch(bob.org, [chat("[[tokens:400]] go") for _ in range(20)])
    run_batch(bobs.pk)

    answer = ok(quote(alice, requests=[line(i, "[[tokens:40]] go") for i in range(10)]))

    output = answer["output_tokens"]
    assert output["basis"] == "history" and output["history_records"] == 20  # alice's own, never bob's
    assert output["expected"] == 400
    past.refresh_from_db()
    spent = (past.input_tokens / 2 * 1 + past.output_tokens / 2 * 4) / 1e6 * 0.5  # half the records' worth
    assert float(answer["cost"]["expected"]) == pytest.approx(spent, rel=0.15)
    assert answer["cost"]["prices"] == {
        "input": "1.000000",
        "cached_input": "1.000000",
        "output": "4.000000",
        "multiplier": "0.5",
    }


def test_a_batch_built_to_miss_the_window_does_not_fit(alice, fresh_sim, settings):
    model = deploy(MODEL, fresh_sim.base_url)
    settings.OPENRELAY_COMPLETION_WINDOWS = "60s:0.5,24h:0.5"
    now = timezone.now()
    # A finished batch measured the model's pace: 100 records of 100 output tokens in 100 s.
    past = make_batch(alice.org, [chat("x")] * 1, model=model)
    Batch.objects.filter(pk=past.pk).update(
        status="completed",
        in_progress_at=now - timedelta(seconds=200),
        finalizing_at=now - timedelta(seconds=100),
        completed_count=100,
        output_tokens=100 * 100,
        total_count=100,
    )
    misses = ok(quote(alice, completion_window="60s", requests=[line(i, max_tokens=100) for i in range(200)]))
    fits = ok(quote(alice, completion_window="60s", requests=[line(i, max_tokens=100) for i in range(20)]))

    assert misses["time"]["basis"] == "recent_batches"
    assert misses["fits_window"] is False and misses["time"]["expected_duration_s"] > 60
    assert fits["fits_window"] is True


def test_the_openai_sdk_quotes_through_a_plain_request(sdk, fresh_sim):
    deploy(MODEL, fresh_sim.base_url)
    answer = sdk.post(
        "/batches/estimate",
        body={"endpoint": CHAT, "completion_window": "24h", "requests": [line(1)]},
        cast_to=object,
    )
    assert answer["object"] == "openrelay.batch_estimate" and answer["request_counts"]["total"] == 1


def test_the_openapi_document_serves_it(client):
    document = client.get("/v1/openapi.json").json()
    assert "post" in document["paths"]["/v1/batches/estimate"]
    assert document["components"]["schemas"]["BatchEstimate"]["properties"]["object"]["enum"] == [
        "openrelay.batch_estimate"
    ]


def test_tool_calling_records_take_their_rounds_from_history(alice, fresh_sim):
    deploy(MODEL, fresh_sim.base_url)
    past = make_batch(alice.org, [chat("x")] * 4)
    past.records.update(status="succeeded", completion_tokens=10, response_body='{"openrelay": {"tool_rounds": 2}}')
    tools = {"openrelay": {"tool_config": {"url": "https://tools.example.com/call"}}}
    plain = ok(quote(alice, requests=[line(1, "x" * 400)]))
    answer = ok(quote(alice, requests=[line(1, "x" * 400, **tools)]))

    assert answer["tool_rounds"] == {"records": 1, "expected": 2.0, "basis": "history", "history_records": 4}
    assert plain["tool_rounds"] is None
    # Each round sends the conversation again, and answers again.
    assert answer["output_tokens"]["expected"] == 3 * plain["output_tokens"]["expected"] == 30
    assert float(answer["cost"]["expected"]) >= float(plain["cost"]["expected"])


def test_the_local_length_is_the_texts():
    from batches.estimate.records import input_length, input_text

    bodies = [
        (
            "/v1/chat/completions",
            {
                "messages": [
                    {"role": "user", "content": "ab"},
                    {
                        "role": "assistant",
                        "content": [{"type": "text", "text": "cd"}],
                        "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}],
                    },
                ]
            },
        ),
        ("/v1/completions", {"prompt": ["one", "two"]}),
        ("/v1/embeddings", {"input": "three"}),
        ("/v1/responses", {"instructions": "be brief", "input": "hi"}),
    ]
    for endpoint, body in bodies:
        assert input_length(endpoint, body) == len(input_text(endpoint, body)), endpoint


def test_the_sample_is_uniform_over_the_records():
    from batches.estimate.records import SAMPLE_SIZE, RecordTally

    tally = RecordTally("/v1/embeddings")
    for number in range(1, 20_001):
        tally.observe({"body": {"input": "x"}}, number)
    lines = sorted(s.line for s in tally.sample)
    assert len(set(lines)) == SAMPLE_SIZE
    halves = sum(number <= 10_000 for number in lines)
    assert 70 <= halves <= 130  # about half from each half of the file (binomial, sd 7)


def test_batches_that_ran_at_once_count_their_time_once():
    from batches.estimate.pace import _covered

    assert _covered([(0, 10), (5, 20), (30, 40)]) == 30
    assert _covered([(0, 10), (2, 3)]) == 10


def test_fair_sharing_splits_the_model_between_organizations():
    from batches.estimate.pace import Pace, Queued, finish_after

    pace = Pace(units_per_s=10.0, records_per_s=1.0, basis="running", queued=[Queued(2, False, 100.0)])
    # Org 2's 100 units and org 1's 100 units share 10 a second: both end at 20 s.
    assert finish_after(pace, 1, False, 100.0) == pytest.approx(20.0)
    # 300 units: 20 s sharing (100 of them), then 200 units alone at 10 a second.
    assert finish_after(pace, 1, False, 300.0) == pytest.approx(40.0)
    # Inside one organization, an expedited batch goes first: alone, it takes its org's whole share.
    own = Pace(units_per_s=10.0, records_per_s=1.0, basis="running", queued=[Queued(1, False, 100.0)])
    assert finish_after(own, 1, True, 50.0) == pytest.approx(5.0)
    assert finish_after(Pace(None, None, "none"), 1, False, 10.0) is None


def test_the_quote_runs_a_short_window_ahead_as_the_engine_does():
    """Issue 52's scenario: organizations A and B each have 3,000 records queued on 24 h windows, on a
    model of 80 records a second; C's 1,500 on a 60 s window would take 56 s at its even third. The
    engine's deadline rule gives C what finishes it by half its window (50 a second of 80), and the
    quote says so; what needs more than 3/4 of the model gets 3/4."""
    from batches.estimate.pace import Pace, Queued, finish_after, fits

    day = 86_400

    def pace():
        backlog = [Queued(org, False, 3000.0, aim_s=day / 2) for org in (1, 2)]
        return Pace(units_per_s=80.0, records_per_s=80.0, basis="running", queued=backlog)

    assert finish_after(pace(), 3, False, 1500.0, day) == pytest.approx(56.25)  # a 24 h window: its even third
    assert finish_after(pace(), 3, False, 1500.0, 60) == pytest.approx(30.0, abs=0.5)
    assert finish_after(pace(), 3, False, 2000.0, 60) == pytest.approx(2000 / 60, abs=0.5)  # 3/4 of 80
    # Alone on the model, a deadline takes what it finds: all of it.
    assert finish_after(Pace(80.0, 80.0, "running"), 3, False, 1500.0, 60) == pytest.approx(1500 / 80)
    # The even third said "at risk" (the high figure, 4x the output, past the window); now it fits.
    durations = {
        name: finish_after(pace(), 3, False, units, 60)
        for name, units in (("low", 500.0), ("expected", 1500.0), ("high", 1800.0))
    }
    assert fits(durations, 60) is True


def test_a_failing_tokenizer_leaves_the_approximation_with_its_reason(alice):
    from openrelay.simulator.config import SimulatorConfig
    from openrelay.simulator.server import run_in_thread

    with run_in_thread(SimulatorConfig(tokenizer="vllm", fail_all_status=503)) as failing:
        deploy(MODEL, failing.base_url)
        answer = ok(quote(alice, requests=[line(1, "x" * 40)]))
    assert answer["input_tokens"]["method"] == "approximation"
    assert "HTTP 503" in answer["input_tokens"]["note"]


def test_an_input_of_rejected_records_only_quotes_nothing_to_run(alice, fresh_sim):
    deploy(MODEL, fresh_sim.base_url)
    answer = ok(quote(alice, requests=[{"custom_id": "a"}, line(2, model="nobody/unknown")]))
    assert answer["request_counts"] == {"total": 0, "rejected": 2, "calls": 0}
    assert answer["input_tokens"] is None and answer["cost"] is None and answer["fits_window"] is None
    assert answer["notes"] == ["No record would be accepted: nothing would run."]
