"""The engine's settings, read once into a frozen value when an engine starts.

Every default is settings.py's (its environment variables are documented
there and in docs/engine.md); nothing below the engine reads
`django.conf.settings` for these, so a test's `override_settings` applies to
the next engine it starts, never to one half-way through its life.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings


@dataclass(frozen=True)
class EngineConfig:
    lease_s: float  # a claimed record is the engine's this long after each renewal
    stop_grace_s: float  # calls in flight may finish this long after a stop is asked
    claim_chunk: int  # the most records a batch claims ahead in one trip
    answer_budget_bytes: int  # model answers held in memory before a flush, over every record
    flush_apart_bytes: int  # a batch's answers in one flush from which it is written apart (apart.py; 0: never)
    call_time_limit_s: float  # one model call, from when it is sent
    upstream_retries: int  # a call's retries and failovers
    prefix_bytes: int  # the prompt prefix that routes records to the same deployment (0: off)
    prefix_window: int  # records claimed ahead when a batch's records share prefixes
    adaptive_concurrency: bool  # the limit of calls a deployment gets moves with its latency (flow.py)
    concurrency_floor: int
    concurrency_start: int
    latency_tolerance: float
    queue_line: float  # the calls estimated waiting in the server, as a share of those in flight (0: off)
    ceiling_hold_s: float  # a 503's ceiling holds the limit this long (0: off)
    max_answer_bytes: int  # a model answer larger than this is a failed server
    idle_timeout_s: float  # a model answer that stops this long is a failed server
    contract_checkers: int  # checker processes (output contracts) one engine may start (checks.py)
    contract_check_time_limit_s: float  # one answer's check in a checker process
    contract_check_memory_bytes: int  # a checker process's address space

    @classmethod
    def read(cls) -> EngineConfig:
        return cls(
            lease_s=settings.OPENRELAY_LEASE_S,
            stop_grace_s=settings.OPENRELAY_STOP_GRACE_S,
            claim_chunk=settings.OPENRELAY_CLAIM_CHUNK,
            answer_budget_bytes=settings.OPENRELAY_ENGINE_ANSWER_BUDGET_BYTES,
            flush_apart_bytes=settings.OPENRELAY_FLUSH_APART_BYTES,
            call_time_limit_s=settings.OPENRELAY_CALL_TIME_LIMIT_S,
            upstream_retries=settings.OPENRELAY_UPSTREAM_RETRIES,
            prefix_bytes=settings.OPENRELAY_PREFIX_BYTES,
            prefix_window=settings.OPENRELAY_PREFIX_WINDOW,
            adaptive_concurrency=settings.OPENRELAY_ADAPTIVE_CONCURRENCY,
            concurrency_floor=settings.OPENRELAY_CONCURRENCY_FLOOR,
            concurrency_start=settings.OPENRELAY_CONCURRENCY_START,
            latency_tolerance=settings.OPENRELAY_LATENCY_TOLERANCE,
            queue_line=settings.OPENRELAY_QUEUE_LINE,
            ceiling_hold_s=settings.OPENRELAY_CEILING_HOLD_S,
            max_answer_bytes=settings.OPENRELAY_MAX_MODEL_RESPONSE_BYTES,
            idle_timeout_s=settings.OPENRELAY_MODEL_IDLE_TIMEOUT_S,
            contract_checkers=settings.OPENRELAY_CONTRACT_CHECKERS,
            contract_check_time_limit_s=settings.OPENRELAY_CONTRACT_CHECK_TIME_LIMIT_S,
            contract_check_memory_bytes=settings.OPENRELAY_CONTRACT_CHECK_MEMORY_BYTES,
        )
