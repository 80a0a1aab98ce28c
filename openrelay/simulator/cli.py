"""The simulator's command line.

The flags `python -m openrelay.simulator` and `manage.py simulate_model` share
(`add_arguments`), the config they make (`config_from_options`), and `main`,
which parses them and serves until SIGINT or SIGTERM
(`openrelay/simulator/__main__.py` runs it).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping
from typing import Any

from openrelay.simulator.config import DEFAULT_MODELS, METRICS_STYLES, TOKENIZER_STYLES, SimulatorConfig
from openrelay.simulator.server import serve


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags shared by `python -m openrelay.simulator` and `manage.py simulate_model`."""
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001, help="0 picks a free port")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="added to every answer")
    parser.add_argument(
        "--error-rate",
        action="append",
        type=parse_error_rates,
        default=[],
        metavar="STATUS=P",
        help="e.g. 503=0.1 (repeat the flag, or 503=0.1,429=0.05)",
    )
    parser.add_argument("--drop-rate", type=float, default=0.0)
    parser.add_argument("--hang-rate", type=float, default=0.0)
    parser.add_argument("--retry-after", type=float, default=None, help="seconds, sent with 429s")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fail-all-status", type=int, default=None, help="answer every request with this status")
    parser.add_argument("--drop-all", action="store_true", help="drop every connection")
    parser.add_argument("--no-record", action="store_true", help="do not record requests")
    parser.add_argument("--record-limit", type=int, default=10_000)
    parser.add_argument("--model", action="append", default=[], help="listed by /v1/models (repeatable)")
    capacity = parser.add_argument_group("capacity model (off while --slots is 0)")
    capacity.add_argument("--slots", type=int, default=0, help="requests decoded at once")
    capacity.add_argument(
        "--queue-limit",
        type=int,
        default=None,
        help="waiting requests past which a new one gets 503 (default: no limit)",
    )
    capacity.add_argument("--prefill-ms-per-token", type=float, default=0.0, help="per uncached prompt token")
    capacity.add_argument("--decode-ms-per-token", type=float, default=0.0, help="per output token, one slot busy")
    capacity.add_argument(
        "--decode-contention",
        type=float,
        default=0.0,
        help="a token takes (1 + C * (busy - 1) / slots) times as long",
    )
    capacity.add_argument("--prefix-cache-tokens", type=int, default=0, help="prefix cache size (LRU)")
    capacity.add_argument(
        "--metrics", choices=METRICS_STYLES[1:], default="", help="serve GET /metrics in this server's style"
    )
    capacity.add_argument(
        "--tokenizer", choices=TOKENIZER_STYLES[1:], default="", help="serve this server's tokenizer route"
    )


def parse_error_rates(text: str) -> dict[int, float]:
    rates = {}
    for pair in text.split(","):
        status, sep, rate = pair.partition("=")
        try:
            rates[int(status)] = float(rate)
        except ValueError:
            message = f"expected STATUS=PROBABILITY, got {pair!r}"
            raise argparse.ArgumentTypeError(message) from None
    return rates


def config_from_options(options: Mapping[str, Any]) -> SimulatorConfig:
    error_rates: dict[int, float] = {}
    for rates in options.get("error_rate") or ():
        error_rates.update(rates)
    return SimulatorConfig(
        latency_ms=options.get("latency_ms") or 0.0,
        error_rates=error_rates,
        drop_rate=options.get("drop_rate") or 0.0,
        hang_rate=options.get("hang_rate") or 0.0,
        retry_after_s=options.get("retry_after"),
        seed=options.get("seed") or 0,
        fail_all_status=options.get("fail_all_status"),
        drop_all=bool(options.get("drop_all")),
        record=not options.get("no_record"),
        record_limit=options.get("record_limit") or 10_000,
        models=tuple(options.get("model") or DEFAULT_MODELS),
        slots=options.get("slots") or 0,
        queue_limit=options.get("queue_limit"),
        prefill_ms_per_token=options.get("prefill_ms_per_token") or 0.0,
        decode_ms_per_token=options.get("decode_ms_per_token") or 0.0,
        decode_contention=options.get("decode_contention") or 0.0,
        prefix_cache_tokens=options.get("prefix_cache_tokens") or 0,
        metrics=options.get("metrics") or "",
        tokenizer=options.get("tokenizer") or "",
    )


def main(argv: Iterable[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m openrelay.simulator",
        description="Simulated OpenAI-compatible model server.",
    )
    add_arguments(parser)
    options = vars(parser.parse_args(argv))
    try:
        config = config_from_options(options)
    except ValueError as exc:
        parser.error(str(exc))
    serve(config, options["host"], options["port"])
