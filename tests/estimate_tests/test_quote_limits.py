"""Quotes bounded (issue 56, finding 4): a per-organization rate, tokenizer calls under the deployment's
own concurrency cap across web processes, and a file's sample counted once per deployment."""

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from batches.estimate import tokens
from files import services as file_services
from openrelay.core.models import Deployment
from tests.batches_api_tests.helpers import upload
from tests.estimate_tests.conftest import line, ok, quote
from tests.estimate_tests.counting import CountingTokenizer
from tests.helpers import CHAT, MODEL, deploy
from tests.processes import Processes

pytestmark = pytest.mark.django_db(transaction=True)

CAP = 4  # the deployment's max_concurrency in these tests
PARALLEL = 48  # the review's 48 quotes at once
RECORDS = 25  # a quote's records: every one counted, 1,200 tokenizer calls in all


@pytest.fixture
def tokenizer():
    with CountingTokenizer() as server:
        yield server


def jsonl(records):
    import orjson

    return b"".join(orjson.dumps(record) + b"\n" for record in records)


# --- the rate -----------------------------------------------------------------------------------


@pytest.fixture
def rate(settings):
    settings.OPENRELAY_BATCH_ESTIMATE_RATE = "3/minute"


def test_the_estimate_is_rate_limited_per_organization(alice, bob, fresh_sim, rate):
    deploy(MODEL, fresh_sim.base_url)
    for i in range(3):
        ok(quote(alice, requests=[line(i)]))
    response = quote(alice, requests=[line(4)])

    assert response.status_code == 429
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limit_exceeded")
    assert "3 per minute" in error["message"] and "quote" in error["message"]
    assert 1 <= int(response["Retry-After"]) <= 60
    # Another organization has its own budget, and creating is not a quote.
    ok(quote(bob, requests=[line(1)]))
    created = alice.client.post(
        "/v1/batches", {"endpoint": CHAT, "completion_window": "24h", "requests": [line(1)]}, format="json"
    )
    assert created.status_code == 200


# --- the deployment's concurrency cap --------------------------------------------------------------


@pytest.mark.slow
def test_48_parallel_quotes_keep_the_tokenizer_under_the_deployments_cap(alice, tokenizer, tmp_path):
    deploy(MODEL, tokenizer.base_url, max_concurrency=CAP)
    # Two web processes: the cap holds across processes (Redis, or file locks under the shared data dir).
    processes = Processes(
        tmp_path / "web",
        OPENRELAY_LOG_LEVEL="WARNING",
        OPENRELAY_BATCH_ESTIMATE_RATE="1000/minute",
        OPENRELAY_ESTIMATE_TOKENIZER_WAIT_S="120",
    )
    try:
        urls = [processes.web("uvicorn"), processes.web("uvicorn")]
        body = {"endpoint": CHAT, "completion_window": "24h", "requests": [line(i) for i in range(RECORDS)]}
        headers = {"Authorization": f"Bearer {alice.key}"}

        def one(n):
            return httpx.post(f"{urls[n % 2]}/v1/batches/estimate", json=body, headers=headers, timeout=120)

        started = time.monotonic()
        with ThreadPoolExecutor(PARALLEL) as pool:
            answers = list(pool.map(one, range(PARALLEL)))
        took = time.monotonic() - started
    finally:
        processes.stop()

    assert [a.status_code for a in answers] == [200] * PARALLEL, answers[0].text
    assert {a.json()["input_tokens"]["method"] for a in answers} == {tokens.VLLM}
    assert tokenizer.calls == PARALLEL * RECORDS
    print(f"48 quotes: peak {tokenizer.peak} in flight (cap {CAP}), {tokenizer.calls} calls, {took:.2f} s")
    assert 1 <= tokenizer.peak <= CAP


def test_no_free_slot_in_time_leaves_the_approximation_with_a_note(alice, tokenizer, settings):
    settings.OPENRELAY_ESTIMATE_TOKENIZER_WAIT_S = 0.3
    deploy(MODEL, tokenizer.base_url, max_concurrency=2)
    slots = tokens.tokenizer_slots(Deployment.objects.get())
    held = [slots.acquire(1.0) for _ in range(2)]
    try:
        assert all(held)
        started = time.monotonic()
        answer = ok(quote(alice, requests=[line(1, "x" * 400)]))
        waited = time.monotonic() - started
    finally:
        for slot in held:
            slot.release()

    assert answer["input_tokens"]["method"] == "approximation" and answer["input_tokens"]["total"] == 100
    assert "busy" in answer["input_tokens"]["note"]
    assert tokenizer.calls == 0
    assert waited < 5
    ok(quote(alice, requests=[line(1, "x" * 400)]))  # the slots back: the tokenizer counts again
    assert tokenizer.calls == 1


# --- a file's sample counted once ------------------------------------------------------------------


def test_a_repeated_quote_of_a_file_makes_no_tokenizer_calls(alice, tokenizer):
    deploy(MODEL, tokenizer.base_url, max_concurrency=CAP)
    file = upload(alice, jsonl([line(i, "word " * (1 + i % 7)) for i in range(300)]))
    first = ok(quote(alice, input_file_id=file.public_id))
    calls = tokenizer.calls
    again = ok(quote(alice, input_file_id=file.public_id))

    assert calls == 200 and tokenizer.calls == calls  # 200: the sample; then none
    assert again["input_tokens"] == first["input_tokens"]
    assert first["input_tokens"]["method"] == tokens.VLLM


def test_inline_requests_are_counted_each_time(alice, tokenizer):
    deploy(MODEL, tokenizer.base_url)
    for _ in range(2):
        ok(quote(alice, requests=[line(1), line(2)]))
    assert tokenizer.calls == 4


def test_a_changed_deployment_counts_again(alice, tokenizer):
    deploy(MODEL, tokenizer.base_url)
    file = upload(alice, jsonl([line(1), line(2)]))
    ok(quote(alice, input_file_id=file.public_id))
    Deployment.objects.update(upstream_model="another-upstream")
    ok(quote(alice, input_file_id=file.public_id))
    assert tokenizer.calls == 4


def test_a_deleted_file_leaves_nothing_cached(alice, tokenizer):
    from batches.estimate import counted

    deploy(MODEL, tokenizer.base_url)
    file = upload(alice, jsonl([line(1), line(2)]))
    ok(quote(alice, input_file_id=file.public_id))
    assert counted.cached(file.public_id)

    file_services.delete_file(file)
    assert not counted.cached(file.public_id)
