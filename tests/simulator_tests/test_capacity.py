"""The simulator's capacity model: slots, the queue and its limit, prefill and
decode costs, the prefix cache, /_sim/stats and /metrics, over real HTTP.

Timing asserts are ratios or one-sided bounds (a loaded machine only makes
requests slower); waits poll the server's figures with a deadline.
"""

import argparse
import asyncio
import math
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from openrelay.simulator.answers import count_tokens
from openrelay.simulator.capacity import capacity_per_second
from openrelay.simulator.cli import add_arguments, config_from_options
from openrelay.simulator.config import SimulatorConfig
from openrelay.simulator.server import run_in_thread

SYSTEM = "You answer questions about the weather, briefly and politely. " * 16  # 992 characters


def chat_body(content, system=None, **extra):
    messages = [{"role": "system", "content": system}] if system else []
    return {"model": "m", "messages": [*messages, {"role": "user", "content": content}], **extra}


async def until(condition, deadline_s=5.0):
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met before the deadline"
        await asyncio.sleep(0.005)


async def post_many(sim, bodies, path="/chat/completions"):
    async with httpx.AsyncClient(base_url=sim.base_url, timeout=30) as client:
        return await asyncio.gather(*(client.post(path, json=body) for body in bodies))


async def closed_loop(sim, in_flight, per_worker, content):
    """`in_flight` callers, each sending `per_worker` requests one after another: (latencies, elapsed)."""
    latencies = []

    async def caller(client, i):
        for j in range(per_worker):
            started = time.perf_counter()
            response = await client.post("/chat/completions", json=chat_body(f"{content} {i}.{j}"))
            assert response.status_code == 200
            latencies.append(time.perf_counter() - started)

    async with httpx.AsyncClient(base_url=sim.base_url, timeout=30) as client:
        started = time.perf_counter()
        await asyncio.gather(*(caller(client, i) for i in range(in_flight)))
        return latencies, time.perf_counter() - started


def mean(values):
    return sum(values) / len(values)


def cached_tokens(answer):
    usage = answer["usage"]
    details = usage.get("prompt_tokens_details") or usage["input_tokens_details"]
    return details["cached_tokens"]


# ---------------------------------------------------------------- slots and queue


def test_it_never_runs_more_than_n_requests_at_once():
    # 12 requests of 200 ms each on 4 slots: 4 run, the rest queue.
    with run_in_thread(SimulatorConfig(slots=4, decode_ms_per_token=4)) as sim:
        bodies = [chat_body(f"question {i} [[tokens:50]]") for i in range(12)]
        responses = asyncio.run(post_many(sim, bodies))
        stats = sim.stats()
    assert [r.status_code for r in responses] == [200] * 12
    assert stats["max_running"] == 4
    assert 1 <= stats["max_waiting"] <= 8
    assert (stats["completed"], stats["running"], stats["waiting"], stats["rejected"]) == (12, 0, 0, 0)
    assert stats["completion_tokens"] == 12 * 50
    assert stats["busy_slot_seconds"] >= 12 * 0.2 * 0.9


def test_a_full_queue_answers_503_at_once_and_the_rest_succeed():
    config = SimulatorConfig(slots=2, queue_limit=2, decode_ms_per_token=10)

    async def scenario(sim):
        async with httpx.AsyncClient(base_url=sim.base_url, timeout=30) as client:
            held = [
                asyncio.create_task(client.post("/chat/completions", json=chat_body(f"held {i} [[tokens:100]]")))
                for i in range(4)
            ]
            await until(lambda: (sim.stats()["running"], sim.stats()["waiting"]) == (2, 2))
            refused = await asyncio.gather(
                *(client.post("/chat/completions", json=chat_body(f"extra {i}")) for i in range(3))
            )
            return refused, await asyncio.gather(*held)

    with run_in_thread(config) as sim:
        refused, held = asyncio.run(scenario(sim))
        stats = sim.stats()
    assert [r.status_code for r in refused] == [503] * 3
    error = refused[0].json()["error"]
    assert error["message"] == "The server is overloaded: 2 requests are waiting."
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "server_error"
    assert refused[0].headers["retry-after"] == "1"
    assert [r.status_code for r in held] == [200] * 4
    assert (stats["rejected"], stats["completed"], stats["max_waiting"]) == (3, 4, 2)


def test_latency_with_2n_in_flight_clearly_exceeds_latency_with_half_n():
    # 4 slots, 200 ms a request: 2 callers never wait, 8 wait about as long as they run.
    with run_in_thread(SimulatorConfig(slots=4, decode_ms_per_token=4)) as sim:
        few, _ = asyncio.run(closed_loop(sim, 2, 3, "[[tokens:50]]"))
        few_stats = sim.stats()
        sim.reset()
        many, _ = asyncio.run(closed_loop(sim, 8, 3, "[[tokens:50]]"))
        many_stats = sim.stats()
    assert few_stats["max_waiting"] == 0 and many_stats["max_waiting"] >= 1
    assert min(few) >= 0.2 * 0.9
    assert mean(many) > 1.4 * mean(few)


def test_throughput_at_n_in_flight_beats_one_in_flight_despite_contention():
    # decode_contention 1: a token takes 1.75x as long with 4 of 4 slots busy
    # (200 -> 350 ms a request), yet 4 at once finish 4 / 1.75 = 2.3x as many a second.
    config = SimulatorConfig(slots=4, decode_ms_per_token=4, decode_contention=1.0)
    with run_in_thread(config) as sim:
        alone, alone_s = asyncio.run(closed_loop(sim, 1, 4, "[[tokens:50]]"))
        together, together_s = asyncio.run(closed_loop(sim, 4, 4, "[[tokens:50]]"))
    alone_rate, together_rate = 4 / alone_s, 16 / together_s
    assert together_rate > 1.6 * alone_rate
    assert mean(together) > 1.3 * mean(alone)  # each request decodes slower
    prompt_tokens = count_tokens("[[tokens:50]] 0.0")
    assert together_rate < 1.25 * capacity_per_second(config, prompt_tokens, 50)


def test_capacity_per_second_follows_the_documented_formula():
    config = SimulatorConfig(slots=16, prefill_ms_per_token=0.5, decode_ms_per_token=10, decode_contention=0.5)
    # A slot is held 0.5 * 400 + 200 * 10 * (1 + 0.5 * 15 / 16) = 3137.5 ms.
    assert capacity_per_second(config, 1000, 200, cached_tokens=600) == pytest.approx(16_000 / 3137.5)
    assert capacity_per_second(config, 1000, 200) == pytest.approx(16_000 / (500 + 2937.5))
    assert capacity_per_second(SimulatorConfig(), 1000, 200) == math.inf
    assert capacity_per_second(SimulatorConfig(slots=4), 1000, 200) == math.inf


# ---------------------------------------------------------------- faults and departures


def test_faults_and_bad_requests_never_take_a_slot():
    config = SimulatorConfig(slots=1, decode_ms_per_token=10, api_key="sk-sim")
    auth = {"Authorization": "Bearer sk-sim"}

    async def scenario(sim):
        async with httpx.AsyncClient(base_url=sim.base_url, timeout=30, headers=auth) as client:
            holder = asyncio.create_task(client.post("/chat/completions", json=chat_body("hold [[tokens:1000]]")))
            await until(lambda: sim.stats()["running"] == 1)
            answers = [
                await client.post("/chat/completions", json=chat_body("[[status:429]]")),
                await client.post("/chat/completions", json={"messages": []}),
                await client.post("/chat/completions", json=chat_body("hi"), headers={"Authorization": "Bearer x"}),
            ]
            stats = sim.stats()
            holder.cancel()  # the caller goes away: its slot is freed
            await asyncio.gather(holder, return_exceptions=True)
            await until(lambda: sim.stats()["running"] == 0)
            return answers, stats

    with run_in_thread(config) as sim:
        answers, stats = asyncio.run(scenario(sim))
        served = httpx.post(sim.base_url + "/chat/completions", json=chat_body("now"), headers=auth)
        after = sim.stats()
    assert [a.status_code for a in answers] == [429, 400, 401]
    assert (stats["running"], stats["max_waiting"], stats["completed"]) == (1, 0, 0)
    assert served.status_code == 200
    assert (after["completed"], after["running"]) == (1, 0)


def test_a_caller_that_gives_up_leaves_the_queue():
    async def scenario(sim):
        async with httpx.AsyncClient(base_url=sim.base_url, timeout=30) as client:
            holder = asyncio.create_task(client.post("/chat/completions", json=chat_body("hold [[tokens:1000]]")))
            await until(lambda: sim.stats()["running"] == 1)
            queued = asyncio.create_task(client.post("/chat/completions", json=chat_body("queued")))
            await until(lambda: sim.stats()["waiting"] == 1)
            queued.cancel()
            await until(lambda: sim.stats()["waiting"] == 0)
            still_running = sim.stats()["running"]
            holder.cancel()
            await asyncio.gather(holder, queued, return_exceptions=True)
            await until(lambda: sim.stats()["running"] == 0)
            return still_running, await client.post("/chat/completions", json=chat_body("next"))

    with run_in_thread(SimulatorConfig(slots=1, decode_ms_per_token=10)) as sim:
        still_running, answer = asyncio.run(scenario(sim))
        stats = sim.stats()
    assert still_running == 1
    assert answer.status_code == 200
    assert (stats["completed"], stats["max_waiting"], stats["waiting"]) == (1, 1, 0)


def test_it_stops_promptly_with_requests_running_and_queued():
    sim = run_in_thread(SimulatorConfig(slots=1, decode_ms_per_token=10)).start()
    outcomes = []

    def call(i):
        try:
            httpx.post(sim.base_url + "/chat/completions", json=chat_body(f"long {i} [[tokens:1000]]"), timeout=30)
        except httpx.HTTPError as exc:
            outcomes.append(exc)

    callers = [threading.Thread(target=call, args=(i,)) for i in range(3)]
    for caller in callers:
        caller.start()
    asyncio.run(until(lambda: (sim.stats()["running"], sim.stats()["waiting"]) == (1, 2)))
    started = time.perf_counter()
    sim.stop()
    for caller in callers:
        caller.join(timeout=5)
    assert time.perf_counter() - started < 3
    assert len(outcomes) == 3 and all(isinstance(o, httpx.TransportError) for o in outcomes)


# ---------------------------------------------------------------- prefix cache


def test_the_prefix_cache_reports_a_repeated_prefix_and_not_a_fresh_one():
    # The cache sees each message as "<role>\n<text>\n"; a block is 64 characters (16 tokens).
    shared_blocks = len(f"system\n{SYSTEM}\nuser\n") // 64
    with run_in_thread(SimulatorConfig(slots=2, prefix_cache_tokens=10_000)) as sim:
        first, again, fresh = (
            httpx.post(sim.base_url + "/chat/completions", json=body).json()
            for body in (
                chat_body("first question", system=SYSTEM),
                chat_body("second question", system=SYSTEM),
                chat_body("first question", system=SYSTEM.upper()),
            )
        )
        stats = sim.stats()
    assert [cached_tokens(a) for a in (first, again, fresh)] == [0, 16 * shared_blocks, 0]
    assert stats["cached_tokens"] == 16 * shared_blocks
    assert stats["prefix_cache_queries"] == stats["prompt_tokens"]


def test_completions_and_responses_report_cached_tokens_too():
    prompt = "Summarize the following report. " * 40  # 1,280 characters: 20 blocks
    with run_in_thread(SimulatorConfig(slots=1, prefix_cache_tokens=10_000)) as sim:
        completions = [
            httpx.post(sim.base_url + "/completions", json={"model": "m", "prompt": prompt}).json() for _ in range(2)
        ]
        body = {"model": "m", "instructions": SYSTEM, "input": "What is batching?"}
        responses = [httpx.post(sim.base_url + "/responses", json=body).json() for _ in range(2)]
    assert [cached_tokens(a) for a in completions] == [0, 320]
    # The blocks of "instructions\n<instructions>\nuser\n<input>\n", at most input_tokens // 16 of them.
    text_blocks = len(f"instructions\n{SYSTEM}\nuser\nWhat is batching?\n") // 64
    blocks = min(text_blocks, responses[0]["usage"]["input_tokens"] // 16)
    assert blocks == 15 < text_blocks
    assert [cached_tokens(a) for a in responses] == [0, 16 * blocks]


def test_the_prefix_cache_evicts_the_least_recently_used_prompt():
    # Room for 20 blocks; each prompt fills 10 ("user\n" + 640 characters + "\n").
    prompts = {name: name * 640 for name in "ABC"}
    with run_in_thread(SimulatorConfig(slots=1, prefix_cache_tokens=320)) as sim:
        cached = [
            (name, cached_tokens(httpx.post(sim.base_url + "/chat/completions", json=chat_body(prompts[name])).json()))
            for name in "ABACAB"
        ]
    # A is used again before C arrives, so C evicts B (least recently used), not A.
    assert cached == [("A", 0), ("B", 0), ("A", 160), ("C", 0), ("A", 160), ("B", 0)]


def test_without_a_prefix_cache_nothing_is_cached():
    body = chat_body("x" * 1000)
    with run_in_thread(SimulatorConfig(slots=1)) as sim:
        answers = [httpx.post(sim.base_url + "/chat/completions", json=body).json() for _ in range(2)]
    assert [cached_tokens(a) for a in answers] == [0, 0]


def test_prefill_is_charged_for_uncached_tokens_only():
    config = SimulatorConfig(slots=1, prefill_ms_per_token=1, prefix_cache_tokens=10_000)
    body = chat_body("y" * 4000)  # 1,000 tokens: 1 s uncached, 16 tokens (16 ms) once cached

    def timed(client):
        started = time.perf_counter()
        answer = client.post("/chat/completions", json=body).json()
        return time.perf_counter() - started, cached_tokens(answer)

    with run_in_thread(config) as sim, httpx.Client(base_url=sim.base_url, timeout=30) as client:
        (cold_s, cold_cached), (warm_s, warm_cached) = timed(client), timed(client)
    assert (cold_cached, warm_cached) == (0, 992)
    assert cold_s >= 1 * 0.9
    assert warm_s < cold_s / 2


# ---------------------------------------------------------------- output length


def test_the_tokens_directive_sets_the_answer_length(sim):
    post = lambda path, body: httpx.post(sim.base_url + path, json=body).json()  # noqa: E731
    long = post("/chat/completions", chat_body("make it long [[tokens:50]]"))
    message = long["choices"][0]["message"]["content"]
    assert long["usage"]["completion_tokens"] == 50 and len(message) == 200
    assert message.startswith("Simulated answer to: make it long sim sim")
    assert long["choices"][0]["finish_reason"] == "stop"
    short = post("/chat/completions", chat_body("[[tokens:2]] keep it short"))
    assert short["choices"][0]["message"]["content"] == "Simulate"
    capped = post("/chat/completions", chat_body("[[tokens:50]]", max_tokens=10))
    assert capped["usage"]["completion_tokens"] == 10 and capped["choices"][0]["finish_reason"] == "length"
    completion = post("/completions", {"model": "m", "prompt": ["a [[tokens:7]]", "b"]})
    assert [count_tokens(c["text"]) for c in completion["choices"]] == [7, count_tokens("Simulated completion of: b")]
    response = post("/responses", {"model": "m", "input": "go [[tokens:30]]"})
    assert response["usage"]["output_tokens"] == 30


def test_decode_is_charged_for_the_tokens_produced():
    with run_in_thread(SimulatorConfig(slots=1, decode_ms_per_token=10)) as sim:
        started = time.perf_counter()
        answer = httpx.post(sim.base_url + "/chat/completions", json=chat_body("[[tokens:1000]]", max_tokens=5))
        elapsed = time.perf_counter() - started
        stats = sim.stats()
    assert answer.json()["usage"]["completion_tokens"] == 5
    assert stats["completion_tokens"] == 5
    assert elapsed < 5  # 1,000 tokens would take 10 s


# ---------------------------------------------------------------- stats and metrics


def test_stats_reset_with_the_recordings():
    body = chat_body("z" * 1000)
    with run_in_thread(SimulatorConfig(slots=2, prefix_cache_tokens=10_000)) as sim:
        httpx.post(sim.base_url + "/chat/completions", json=body)
        over_http = httpx.get(sim.url + "/_sim/stats").json()
        assert over_http == sim.stats()
        assert over_http["completed"] == 1 and over_http["prompt_tokens"] == 250
        httpx.post(sim.url + "/_sim/reset")
        reset = sim.stats()
        again = httpx.post(sim.base_url + "/chat/completions", json=body).json()
    assert {k: reset[k] for k in ("completed", "prompt_tokens", "max_running", "busy_slot_seconds")} == {
        "completed": 0,
        "prompt_tokens": 0,
        "max_running": 0,
        "busy_slot_seconds": 0.0,
    }
    assert cached_tokens(again) == 0  # the reset emptied the prefix cache too


STYLES = {
    "vllm": (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:generation_tokens",
    ),
    "llamacpp": (
        "llamacpp:requests_processing",
        "llamacpp:requests_deferred",
        "llamacpp:kv_cache_usage_ratio",
        "llamacpp:tokens_predicted",
    ),
}


def scrape(client):
    families = text_string_to_metric_families(client.get("/metrics").text)
    return {f.name: (f.type, f.samples) for f in families}


@pytest.mark.parametrize("style", STYLES)
def test_metrics_show_running_and_waiting_while_requests_are_held(style):
    running, waiting, usage, generated = STYLES[style]
    config = SimulatorConfig(slots=2, decode_ms_per_token=5, metrics=style)
    seen = {}

    async def scenario(sim, scraper):
        bodies = [chat_body(f"held {i} [[tokens:160]]") for i in range(4)]  # 0.8 s each
        held = asyncio.create_task(post_many(sim, bodies))

        def both_show():
            seen.update(scrape(scraper))
            return seen[running][1][0].value == 2 and seen[waiting][1][0].value == 2

        await until(both_show)
        return await held

    with run_in_thread(config) as sim, httpx.Client(base_url=sim.url, timeout=30) as scraper:
        responses = asyncio.run(scenario(sim, scraper))
        after = scrape(scraper)
    assert [r.status_code for r in responses] == [200] * 4
    assert seen[usage][0] == "gauge" and seen[usage][1][0].value == 1.0
    assert (after[running][1][0].value, after[waiting][1][0].value, after[usage][1][0].value) == (0, 0, 0)
    assert after[generated][0] == "counter" and after[generated][1][0].value == 4 * 160
    if style == "vllm":
        assert {s.labels["model_name"] for _, samples in after.values() for s in samples} == {"gpt-4o-mini"}
        assert {
            "vllm:gpu_cache_usage_perc",
            "vllm:prompt_tokens",
            "vllm:prefix_cache_queries",
            "vllm:prefix_cache_hits",
        } <= set(after)
    else:
        assert "llamacpp:prompt_tokens" in after


def test_metrics_are_off_by_default_and_llamacpp_asks_for_the_key(sim):
    assert httpx.get(sim.url + "/metrics").status_code == 404
    with run_in_thread(SimulatorConfig(slots=1, metrics="llamacpp", api_key="sk-sim")) as guarded:
        assert httpx.get(guarded.url + "/metrics").status_code == 401
        keyed = httpx.get(guarded.url + "/metrics", headers={"Authorization": "Bearer sk-sim"})
    assert keyed.status_code == 200 and keyed.headers["content-type"].startswith("text/plain")


# ---------------------------------------------------------------- command line


def test_it_builds_the_capacity_model_from_command_line_flags():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    flags = "--slots 16 --queue-limit 64 --prefill-ms-per-token 0.2 --decode-ms-per-token 20 "
    flags += "--decode-contention 0.5 --prefix-cache-tokens 200000 --metrics llamacpp"
    config = config_from_options(vars(parser.parse_args(flags.split())))
    assert (config.slots, config.queue_limit, config.prefix_cache_tokens) == (16, 64, 200_000)
    assert config.metrics == "llamacpp"
    assert (config.prefill_ms_per_token, config.decode_ms_per_token, config.decode_contention) == (0.2, 20, 0.5)
    defaults = config_from_options(vars(parser.parse_args([])))
    assert (defaults.slots, defaults.queue_limit, defaults.metrics) == (0, None, "")
    with pytest.raises(ValueError):
        SimulatorConfig(slots=-1)
    with pytest.raises(ValueError):
        SimulatorConfig(metrics="tgi")
