"""The simulator's configuration.

`SimulatorConfig` holds every server-wide knob (latency, error rates, drops
and hangs, the API key, recording, the models `/v1/models` lists, the capacity
model's shape and the `/metrics` style), checked when it is made, with the
default models and the metrics styles it accepts. It imports nothing else of
the package, so every module may use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

DEFAULT_MODELS = ("gpt-4o-mini", "gpt-4o", "text-embedding-3-small")
METRICS_STYLES = ("", "vllm", "llamacpp")
# The tokenizer route a server offers: vLLM's POST /tokenize, or llama.cpp's POST /v1/chat/completions/input_tokens
# (with its raw-text /tokenize beside it).
TOKENIZER_STYLES = ("", "vllm", "llamacpp")


@dataclass
class SimulatorConfig:
    latency_ms: float = 0.0
    error_rates: Mapping[int, float] = field(default_factory=dict)
    drop_rate: float = 0.0
    hang_rate: float = 0.0
    retry_after_s: float | None = None
    seed: int = 0
    fail_all_status: int | None = None
    drop_all: bool = False
    api_key: str = ""
    record: bool = True
    record_limit: int = 10_000
    models: tuple[str, ...] = DEFAULT_MODELS
    # The capacity model (off while slots is 0; see "Capacity model" in the package docstring).
    slots: int = 0
    queue_limit: int | None = None
    prefill_ms_per_token: float = 0.0
    decode_ms_per_token: float = 0.0
    decode_contention: float = 0.0
    prefix_cache_tokens: int = 0
    metrics: str = ""  # "", "vllm" or "llamacpp"
    tokenizer: str = ""  # "", "vllm" or "llamacpp": the tokenizer route it serves (none by default)

    def __post_init__(self) -> None:
        self.error_rates = {int(s): float(p) for s, p in dict(self.error_rates).items()}
        # The random outcomes are exclusive slices of one draw in [0, 1).
        if self.drop_rate + self.hang_rate + sum(self.error_rates.values()) > 1:
            raise ValueError("drop_rate + hang_rate + error_rates must not exceed 1")
        self.models = tuple(self.models)
        self._check_capacity()

    def _check_capacity(self) -> None:
        if self.slots < 0 or self.prefix_cache_tokens < 0 or (self.queue_limit or 0) < 0:
            raise ValueError("slots, queue_limit and prefix_cache_tokens must not be negative")
        if min(self.prefill_ms_per_token, self.decode_ms_per_token, self.decode_contention) < 0:
            raise ValueError("the per-token costs and decode_contention must not be negative")
        if self.metrics not in METRICS_STYLES:
            raise ValueError(f"metrics must be one of {', '.join(repr(m) for m in METRICS_STYLES)}")
        if self.tokenizer not in TOKENIZER_STYLES:
            raise ValueError(f"tokenizer must be one of {', '.join(repr(t) for t in TOKENIZER_STYLES)}")

    @property
    def draws_at_random(self) -> bool:
        return bool(self.drop_rate or self.hang_rate or any(self.error_rates.values()))
