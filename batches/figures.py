"""What an engine publishes of each deployment with its heartbeat, as the operator page and GET /metrics read it.

A leaf both sides import: the engine writes the figures (its tallies, batches.tallies,
from its adaptive limits, batches.engine.calls.flow) and levels its limits with the other engines'
(flow.peer_limits); batches.operator reads them back for the operator page and GET /metrics.
"""

from typing import NamedTuple


class Figures(NamedTuple):
    """What an engine publishes of one deployment with each heartbeat (batches.tallies.take),
    stored as a JSON list on its Engine row: the operator page and GET /metrics sum them over the
    live engines, and the other engines level their limits with `limit` (flow.peer_limits)."""

    in_flight: int  # calls in flight there now
    calls: int  # calls of the last minute
    failed: int  # of those, failed (batches.callcount)
    limit: int | None  # this engine's adaptive limit there; None once its lane has closed

    @classmethod
    def stored(cls, figures):
        """The figures as an Engine row holds them (an older engine published three: no limit)."""
        in_flight, calls, failed, limit = (list(figures) + [0, 0, 0, None][len(figures) :])[:4]
        return cls(in_flight, calls, failed, limit)
