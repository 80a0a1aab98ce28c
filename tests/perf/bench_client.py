"""The reference client of `manage.py bench`: bare asyncio + aiohttp, no gateway.

    .venv/bin/python -m tests.perf.bench_client --url http://127.0.0.1:PORT/v1 \
        --input requests.jsonl --output answers.jsonl --concurrency 64 --model sim-upstream

Sends every line's body of a batch input file to a model server with a fixed
concurrency (N coroutines pulling lines from one shared iterator, one
ClientSession), and writes each answer as a JSONL line
`{"custom_id", "status_code", "body"}`. This is what a gateway's record
rate is compared with: the same bodies, the same server, the same
concurrency, and the answers on disk. Prints one JSON object with the
record count, the elapsed seconds and the CPU seconds sending took. Runs in its own process so its event
loop has a core to itself, like a worker's.
"""

import argparse
import asyncio
import sys
import time

import aiohttp
import orjson


async def send_all(url, lines, output, concurrency, model):
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=0)
    headers = {"Content-Type": "application/json"}
    sent = 0

    async with aiohttp.ClientSession(connector=connector, skip_auto_headers=("User-Agent",)) as session:

        async def worker():
            nonlocal sent
            for line in lines:
                request = orjson.loads(line)
                body = request["body"]
                body["model"] = model
                async with session.post(url, data=orjson.dumps(body), headers=headers) as response:
                    raw = await response.read()
                    status = response.status
                output.write(
                    b'{"custom_id":'
                    + orjson.dumps(request["custom_id"])
                    + b',"status_code":'
                    + str(status).encode()
                    + b',"body":'
                    + raw
                    + b"}\n"
                )
                sent += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return sent


def run(url, input_path, output_path, concurrency, model):
    with open(input_path, "rb") as lines, open(output_path, "wb") as output:
        started, cpu = time.perf_counter(), time.process_time()
        sent = asyncio.run(send_all(url.rstrip("/") + "/chat/completions", lines, output, concurrency, model))
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    # cpu_s: what sending took of the CPU (the interpreter's start-up aside), the gateway's yardstick.
    return {"records": sent, "elapsed_s": elapsed, "records_per_s": sent / elapsed, "cpu_s": cpu}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the model server's base URL, e.g. http://127.0.0.1:8001/v1")
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--model", default="sim-upstream")
    args = parser.parse_args(argv)
    result = run(args.url, args.input, args.output, args.concurrency, args.model)
    sys.stdout.write(orjson.dumps(result).decode() + "\n")


if __name__ == "__main__":
    main()
