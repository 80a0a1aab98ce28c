"""`GET /metrics` in vLLM's or llama.cpp's names.

The capacity model's figures as Prometheus text, under vLLM's names and labels
(`vllm:*`) or llama-server's (`llamacpp:*`), as `SimulatorConfig.metrics`
asks.
"""

from __future__ import annotations

from typing import Any

from openrelay.simulator.config import SimulatorConfig

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def render_metrics(config: SimulatorConfig, stats: dict[str, Any]) -> str:
    """Prometheus text with vLLM's or llama.cpp's metric names and types, from the live figures.

    KV-cache usage is busy slots / slots (the simulator keeps no KV blocks).
    """
    usage = stats["running"] / config.slots if config.slots else 0.0
    if config.metrics == "llamacpp":
        # llama-server's prompt counter counts the tokens it processed, so
        # cached ones are left out; its lines carry no labels.
        return "".join(
            [
                _metric(
                    "llamacpp:prompt_tokens_total",
                    "counter",
                    "Prompt tokens processed (uncached).",
                    stats["prompt_tokens"] - stats["cached_tokens"],
                ),
                _metric("llamacpp:tokens_predicted_total", "counter", "Tokens generated.", stats["completion_tokens"]),
                _metric("llamacpp:kv_cache_usage_ratio", "gauge", "Busy slots / slots (0 to 1).", usage),
                _metric("llamacpp:requests_processing", "gauge", "Requests holding a slot.", stats["running"]),
                _metric("llamacpp:requests_deferred", "gauge", "Requests waiting for a slot.", stats["waiting"]),
            ]
        )
    # vLLM writes through prometheus_client: float values, model_name and engine labels.
    model = (config.models[0] if config.models else "").replace("\\", "\\\\").replace('"', '\\"')
    labels = f'{{engine="0",model_name="{model}"}}'
    gauges = [
        ("vllm:num_requests_running", "Requests holding a slot.", stats["running"]),
        ("vllm:num_requests_waiting", "Requests waiting for a slot.", stats["waiting"]),
        ("vllm:kv_cache_usage_perc", "Busy slots / slots (0 to 1).", usage),
        ("vllm:gpu_cache_usage_perc", "The older name of vllm:kv_cache_usage_perc.", usage),
    ]
    counters = [
        ("vllm:prompt_tokens_total", "Prompt tokens, cached or not.", stats["prompt_tokens"]),
        ("vllm:generation_tokens_total", "Tokens generated.", stats["completion_tokens"]),
        (
            "vllm:prefix_cache_queries_total",
            "Prompt tokens looked up in the prefix cache.",
            stats["prefix_cache_queries"],
        ),
        ("vllm:prefix_cache_hits_total", "Prompt tokens found in the prefix cache.", stats["cached_tokens"]),
    ]
    return "".join(
        [_metric(name, "gauge", text, float(value), labels) for name, text, value in gauges]
        + [_metric(name, "counter", text, float(value), labels) for name, text, value in counters]
    )


def _metric(name: str, kind: str, help_text: str, value: float, labels: str = "") -> str:
    return f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n{name}{labels} {value}\n"
