"""A quote against a real llama.cpp server: its input tokens equal what the server reports when the batch runs.

    .venv/bin/python tests/real/llamacpp_estimate.py            # skips when no llama-server is built
    .venv/bin/python tests/real/llamacpp_estimate.py --build    # builds it first (13 minutes, see llamacpp_build.py)

Run by hand, like tests/real/llamacpp.py, whose servers it reuses: llama-server
with the tiny GGUF model and OpenRelay (SQLite, uvicorn, a qcluster) with it
registered as `peer/tiny-llama`. Through the OpenAI SDK's plain request it asks
POST /v1/batches/estimate for chat records of several shapes (a system
message, a conversation, a longer prompt), then creates the batch and checks:
- the quote counted with llama.cpp's `POST /v1/chat/completions/input_tokens`
  (method `llamacpp_input_tokens`), every record (no sampling);
- the quoted input tokens equal the batch's usage.input_tokens when it
  completes, and what llama-server's /metrics counted while it ran.
Without a cached llama-server binary it prints why and exits 0 (skipped).
It prints a JSON summary and exits 1 if a check failed.
"""

import json
import sys
import tempfile
import time
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llamacpp
import llamacpp_build

CHAT = "/v1/chat/completions"
RECORDS = [
    llamacpp.line("plain", CHAT, llamacpp.chat("Name three primary colors.")),
    llamacpp.line(
        "system",
        CHAT,
        {
            "messages": [
                {"role": "system", "content": "You answer in one word."},
                {"role": "user", "content": "What color is the sky?"},
            ],
            "max_tokens": 4,
        },
    ),
    llamacpp.line(
        "conversation",
        CHAT,
        {
            "messages": [
                {"role": "user", "content": "Hello."},
                {"role": "assistant", "content": "Hi! How can I help?"},
                {"role": "user", "content": "Tell me a short fact about llamas."},
            ],
            "max_tokens": 6,
        },
    ),
    llamacpp.line("long", CHAT, llamacpp.chat("batch processing saves money. " * 6)),
]


def quote_then_run(client, llama_base):
    with tempfile.NamedTemporaryFile("wb", suffix=".jsonl", delete=False) as f:
        f.write(b"".join(json.dumps(r).encode() + b"\n" for r in RECORDS))
    upload = client.files.create(file=open(f.name, "rb"), purpose="batch")
    body = {"input_file_id": upload.id, "endpoint": CHAT, "completion_window": "24h"}
    quote = client.post("/batches/estimate", body=body, cast_to=object)
    before = llamacpp.metrics(llama_base)
    batch = client.batches.create(input_file_id=upload.id, endpoint=CHAT, completion_window="24h")
    deadline = time.monotonic() + llamacpp.DEADLINE_S
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{batch.id} still {batch.status} after {llamacpp.DEADLINE_S} s")
        time.sleep(0.5)
        batch = client.batches.retrieve(batch.id)
    after = llamacpp.metrics(llama_base)
    counted = sum(after[k] - before[k] for k in ("prompt_tokens_total", "prompt_tokens_cached_total"))
    return quote, batch, counted


def main(argv):
    cache = llamacpp_build.cache_dir()
    if "--build" not in argv and not (cache / "bin" / "llama-server").exists():
        print(f"skipped: no llama-server in {cache / 'bin'} (run with --build, or tests/real/llamacpp.py, first)")
        return 0
    checks = llamacpp.Checks()
    with tempfile.TemporaryDirectory(prefix="openrelay-real-") as tmp:
        work = Path(tmp)
        with (
            llamacpp.llama_server(cache, work) as (llama_base, _),
            llamacpp.openrelay(work, llama_base) as (url, key),
        ):
            client = openai.OpenAI(base_url=url, api_key=key, max_retries=0)
            quote, batch, counted = quote_then_run(client, llama_base)
    tokens = quote["input_tokens"]
    reported = batch.usage.input_tokens if batch.usage else None
    checks.that(batch.status == "completed", f"the batch ended {batch.status}")
    checks.that(tokens["method"] == "llamacpp_input_tokens", f"the quote counted by {tokens['method']}")
    checks.that(not tokens["sampled"], "the quote sampled 5 records")
    checks.that(tokens["total"] == reported, f"quoted {tokens['total']} input tokens, the batch reports {reported}")
    checks.that(tokens["total"] == counted, f"quoted {tokens['total']} input tokens, llama-server counted {counted}")
    summary = {"quoted": tokens, "reported": reported, "llama_server_counted": counted, "failed": checks.failed}
    print(json.dumps(summary, indent=2))
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
