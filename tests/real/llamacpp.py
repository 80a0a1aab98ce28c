"""A real llama.cpp server behind OpenRelay, run by hand (not part of the default suite).

    .venv/bin/python tests/real/llamacpp.py          # OPENRELAY_REAL_CACHE=... to cache elsewhere

The first run builds llama-server from the sources of PyPI's llama-cpp-python
sdist (13 minutes on 2 shared cores at nice 19 here; tests/real/llamacpp_build.py) and caches
the binary outside the repository (~/.cache/openrelay-real by default). It
then makes a tiny GGUF model (2 layers, random weights, the tokenizer of
llama.cpp's vocab-only ggml-vocab-llama-spm.gguf, a ChatML template), starts
llama-server with --metrics, and OpenRelay (SQLite, uvicorn, a qcluster) with
the model registered as `peer/tiny-llama` (upstream name `tiny-upstream`, no
cached-input price). Through the openai SDK it runs:

1. a chat batch: plain records, records with llama.cpp's extra sampling
   parameters, a prompt longer than a slot's context (its 400 must land in
   the error file), a prompt sent twice (the prompt cache reports it cached);
2. a /v1/responses batch;
3. a record with n: 2 (llama.cpp answers two choices and reports one's tokens).

and checks: output bodies name `peer/tiny-llama`; neither the upstream name,
the model file nor the server's address appears in any result file or batch
answer; each batch's usage equals what llama-server's /metrics counted while
it ran (input = prompt_tokens_total + prompt_tokens_cached_total, cached =
prompt_tokens_cached_total, output = tokens_predicted_total), except batch 3,
whose shortfall is reported; the cost bills cached tokens at the input price.
It prints a JSON summary and exits 1 if a check failed.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path

import httpx
import openai

from openrelay.lib import children

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llamacpp_build

ROOT = Path(__file__).resolve().parents[2]
MODEL, UPSTREAM = "peer/tiny-llama", "tiny-upstream"
PRICE_INPUT, PRICE_OUTPUT, MULTIPLIER = Decimal("0.2"), Decimal("0.8"), Decimal("0.5")
SLOT_CONTEXT = 256  # -c 512 over 2 slots
DEADLINE_S = 600


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(predicate, what, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise TimeoutError(f"waited {timeout} s for {what}")


def answers(url):
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def process(argv, log, **kwargs):
    with open(log, "wb") as out:
        child = children.popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, **kwargs)
    try:
        yield child
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGTERM)
            try:
                child.wait(timeout=45)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()


def tiny_model(cache):
    path = cache / "tiny.gguf"
    if not path.exists():
        vocab = llamacpp_build.sources(cache) / "models" / "ggml-vocab-llama-spm.gguf"
        llamacpp_build.run(
            llamacpp_build.tool_python(cache), Path(__file__).with_name("make_tiny_gguf.py"), vocab, path
        )
    return path


@contextmanager
def llama_server(cache, work):
    binary, model = llamacpp_build.server_binary(cache), tiny_model(cache)
    port = free_port()
    argv = llamacpp_build.server_argv(binary, model, port, slots=2, slot_context=SLOT_CONTEXT)
    with process(["nice", "-n", "19", *argv], work / "llama-server.log"):
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: answers(f"{base}/health"), "llama-server")
        yield base, model


def metrics(base):
    text = httpx.get(f"{base}/metrics").text
    found = dict(re.findall(r"^llamacpp:(\w+) ([0-9.e+]+)$", text, re.M))
    return {
        name: int(float(found[name]))
        for name in ("prompt_tokens_total", "prompt_tokens_cached_total", "tokens_predicted_total")
    }


def manage(env, *args):
    result = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    return result.stdout


@contextmanager
def openrelay(work, llama_base):
    env = {**os.environ, "OPENRELAY_DATA_DIR": str(work / "data"), "OPENRELAY_LOG_LEVEL": "WARNING"}
    env.pop("DATABASE_URL", None), env.pop("REDIS_URL", None)  # SQLite and the ORM broker, as `up` runs
    manage(env, "migrate", "--noinput")
    manage(
        env,
        "set_model",
        MODEL,
        "--base-url",
        f"{llama_base}/v1",
        "--upstream-model",
        UPSTREAM,
        "--input-price",
        str(PRICE_INPUT),
        "--output-price",
        str(PRICE_OUTPUT),
        "--concurrency",
        "2",
    )
    key = manage(env, "create_org", "real-llama").strip().splitlines()[-1]
    port = free_port()
    web = [
        sys.executable,
        "-m",
        "uvicorn",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "openrelay.asgi:application",
    ]
    with (
        process(web, work / "web.log", cwd=ROOT, env=env),
        process([sys.executable, "manage.py", "qcluster"], work / "qcluster.log", cwd=ROOT, env=env),
    ):
        url = f"http://127.0.0.1:{port}/v1"
        wait_for(lambda: answers(f"{url}/openapi.json"), "OpenRelay's web server")
        yield url, key


def line(custom_id, url, body):
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": {"model": MODEL, **body}}


def chat(text, **extra):
    return {"messages": [{"role": "user", "content": text}], "max_tokens": 8, **extra}


CHAT_RECORDS = [
    line("plain-1", "/v1/chat/completions", chat("Name three primary colors.")),
    line("plain-2", "/v1/chat/completions", chat("Name three prime numbers.")),
    line("plain-3", "/v1/chat/completions", chat("What is a batch API?", max_tokens=4)),
    line(
        "sampling-1",
        "/v1/chat/completions",
        chat(
            "Tell me about llamas.",
            temperature=0.7,
            top_p=0.9,
            top_k=20,
            min_p=0.05,
            repeat_penalty=1.1,
            seed=22,
            presence_penalty=0.2,
            frequency_penalty=0.1,
            stop=["\n\n"],
        ),
    ),
    line(
        "sampling-2",
        "/v1/chat/completions",
        chat("Count to five.", temperature=0, seed=7, typical_p=0.95, mirostat=0, n_probs=0),
    ),
    line("too-long", "/v1/chat/completions", chat("word " * (SLOT_CONTEXT * 2))),
]
CACHE_PROMPT = "Summarize the following: " + "batch processing saves money. " * 12
CACHE_RECORDS = [line(f"cache-{i}", "/v1/chat/completions", chat(CACHE_PROMPT)) for i in (1, 2)]
RESPONSES_RECORDS = [
    line("responses-1", "/v1/responses", {"input": "Say hello.", "max_output_tokens": 6}),
    line(
        "responses-2",
        "/v1/responses",
        {"input": [{"role": "user", "content": "Say goodbye."}], "instructions": "Be brief.", "max_output_tokens": 6},
    ),
]
N2_RECORDS = [line("two-choices", "/v1/chat/completions", chat("Pick a number.", n=2))]


def run_batch(client, url, key, llama_base, endpoint, records):
    """Upload, create, poll to the end; (batch JSON, output lines, error lines, /metrics delta)."""
    before = metrics(llama_base)
    with tempfile.NamedTemporaryFile("wb", suffix=".jsonl", delete=False) as f:
        f.write(b"".join(json.dumps(r).encode() + b"\n" for r in records))
    upload = client.files.create(file=open(f.name, "rb"), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint=endpoint, completion_window="24h")
    deadline = time.monotonic() + DEADLINE_S
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{batch.id} still {batch.status} after {DEADLINE_S} s")
        time.sleep(0.5)
        batch = client.batches.retrieve(batch.id)
    raw = httpx.get(f"{url}/batches/{batch.id}", headers={"Authorization": f"Bearer {key}"}).json()
    output = client.files.content(batch.output_file_id).text if batch.output_file_id else ""
    errors = client.files.content(batch.error_file_id).text if batch.error_file_id else ""
    after = metrics(llama_base)
    delta = {name: after[name] - before[name] for name in after}
    return raw, [json.loads(x) for x in output.splitlines()], [json.loads(x) for x in errors.splitlines()], delta


def usd(tokens, price):
    return tokens * price * MULTIPLIER / 1_000_000


class Checks:
    def __init__(self):
        self.failed = []

    def that(self, ok, what):
        if not ok:
            self.failed.append(what)
        return ok


def check_batch(checks, name, raw, output, errors, delta, hidden, exact=True):
    text = json.dumps([raw, output, errors])
    for secret in hidden:
        checks.that(secret not in text, f"{name}: {secret!r} appears in a result file or the batch")
    checks.that(
        {o["response"]["body"].get("model") for o in output} <= {MODEL}, f"{name}: an output names another model"
    )
    usage = raw["usage"] or {"input_tokens": 0, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 0}
    billed = {
        "input": usage["input_tokens"],
        "cached": usage["input_tokens_details"]["cached_tokens"],
        "output": usage["output_tokens"],
    }
    counted = {
        "input": delta["prompt_tokens_total"] + delta["prompt_tokens_cached_total"],
        "cached": delta["prompt_tokens_cached_total"],
        "output": delta["tokens_predicted_total"],
    }
    if exact:
        checks.that(billed == counted, f"{name}: billed {billed} but llama-server counted {counted}")
    if raw["usage"]:
        cost = raw["openrelay"]["cost"]
        expected_cached = usd(billed["cached"], PRICE_INPUT)  # no cached price: the input price
        checks.that(
            Decimal(cost["cached_input"]) == expected_cached.quantize(Decimal("1e-9")),
            f"{name}: cached input cost {cost['cached_input']} != {expected_cached}",
        )
    return {
        "status": raw["status"],
        "request_counts": raw["request_counts"],
        "billed": billed,
        "llama_server_counted": counted,
        "implausible_usage": raw["openrelay"]["implausible_usage"],
        "cost": raw["openrelay"]["cost"],
    }


def main():
    cache = llamacpp_build.cache_dir()
    checks, summary = Checks(), {}
    with tempfile.TemporaryDirectory(prefix="openrelay-real-") as tmp:
        work = Path(tmp)
        with llama_server(cache, work) as (llama_base, model_file), openrelay(work, llama_base) as (url, key):
            client = openai.OpenAI(base_url=url, api_key=key, max_retries=0)
            hidden = [UPSTREAM, model_file.name, llama_base.removeprefix("http://")]
            server_info = httpx.get(f"{llama_base}/props").json()
            summary["llama_server"] = {"build": server_info.get("build_info"), "model": "2 layers, n_embd 64, F32"}

            raw, output, errors, delta = run_batch(client, url, key, llama_base, "/v1/chat/completions", CHAT_RECORDS)
            summary["chat"] = check_batch(checks, "chat", raw, output, errors, delta, hidden)
            too_long = [e for e in errors if e["custom_id"] == "too-long"]
            checks.that(len(output) == 5, f"chat: {len(output)} outputs, not 5")
            checks.that(
                len(too_long) == 1 and too_long[0]["response"]["status_code"] == 400,
                f"chat: the prompt over the context is not a 400 in the error file: {too_long}",
            )
            summary["chat"]["too_long_error"] = (
                too_long[0]["response"]["body"]["error"]["message"] if too_long else None
            )

            raw, output, errors, delta = run_batch(client, url, key, llama_base, "/v1/chat/completions", CACHE_RECORDS)
            summary["cache"] = check_batch(checks, "cache", raw, output, errors, delta, hidden)

            raw, output, errors, delta = run_batch(client, url, key, llama_base, "/v1/responses", RESPONSES_RECORDS)
            summary["responses"] = check_batch(checks, "responses", raw, output, errors, delta, hidden)
            checks.that(
                [o["response"]["body"]["object"] for o in output] == ["response", "response"],
                f"responses: outputs {[o['response']['body'].get('object') for o in output]}",
            )

            raw, output, errors, delta = run_batch(client, url, key, llama_base, "/v1/chat/completions", N2_RECORDS)
            summary["n2"] = check_batch(checks, "n2", raw, output, errors, delta, hidden, exact=False)
            summary["n2"]["choices"] = len(output[0]["response"]["body"]["choices"]) if output else None
    summary["failed_checks"] = checks.failed
    print(json.dumps(summary, indent=2))
    (cache / "last-run.json").write_text(json.dumps(summary, indent=2))
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
