"""A request's fate: answer, fail with a status, drop the connection or hang.

Decided from the server-wide knobs (`fail_all_status`, `drop_all`, the rates),
the request's fault directives, how many times its exact body was seen, and
one random draw seeded by (seed, body hash, that count), so a run is
reproducible however concurrently its requests arrive.
"""

from __future__ import annotations

import random

from openrelay.simulator.config import SimulatorConfig
from openrelay.simulator.directives import FaultDirectives

ANSWER, FAIL, DROP, HANG = "answer", "fail", "drop", "hang"


def choose_outcome(
    config: SimulatorConfig, directives: FaultDirectives, seen: int, draw: float | None
) -> tuple[str, int | None]:
    """Decide the fate of one request: (ANSWER | FAIL | DROP | HANG, status)."""
    if config.drop_all:
        return DROP, None
    if config.fail_all_status:
        return FAIL, config.fail_all_status
    if directives.hang:
        return HANG, None
    if directives.drop and (directives.drop_times is None or seen < directives.drop_times):
        return DROP, None
    if directives.status and directives.status >= 400:
        if directives.status_times is None or seen < directives.status_times:
            return FAIL, directives.status
    if draw is not None:
        return _outcome_of_draw(config, draw)
    return ANSWER, None


def _outcome_of_draw(config: SimulatorConfig, draw: float) -> tuple[str, int | None]:
    # One draw, cut into exclusive slices: drop, hang, then each error status.
    edge = config.drop_rate
    if draw < edge:
        return DROP, None
    edge += config.hang_rate
    if draw < edge:
        return HANG, None
    for status, rate in sorted(config.error_rates.items()):
        edge += rate
        if draw < edge:
            return FAIL, status
    return ANSWER, None


def seeded_draw(seed: int, body_hash: bytes, seen: int) -> float:
    # Seeded by the body and its repeat count, not by arrival order, so a run
    # is reproducible under any concurrency.
    return random.Random(f"{seed}:{body_hash.hex()}:{seen}").random()
