"""Completion windows: the ones the operator offers (OPENRELAY_COMPLETION_WINDOWS), each with its rate.

A window is how long a batch has (its expires_at is created_at plus the
window) and what it bills: a standard batch pays the window's share of the
sync price, an expedited one the sync price on any window. A batch
snapshots its multiplier at create (Batch.price_multiplier), so a change
of the setting never reprices a batch. Create, the quote, /v1/limits and
the model catalog all read the windows here.
"""

from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from functools import lru_cache

from django.conf import settings

from openrelay.api.params import invalid_choice
from openrelay.lib.env import parse_windows

EXPEDITED_MULTIPLIER = Decimal("1.0")
# The deadline rule (docs/concepts/how-batches-run.md#deadlines), one home for the engine's gate
# (batches.engine.fairness) and the quote (batches.estimate.pace): a batch is given what would finish
# its records left by the time DEADLINE_MARGIN of its window is left (the pace is measured, not
# promised: the model slows, records fail and retry), and the batches behind their deadline together
# take at most DEADLINE_MAX_SHARE of a model before the others.
DEADLINE_MARGIN = 0.5
DEADLINE_MAX_SHARE = 0.75
# Anthropic's Message Batches have a fixed 24 h: theirs unless the operator does not offer it.
ANTHROPIC_WINDOW = "24h"


@dataclass(frozen=True)
class Window:
    name: str
    seconds: int
    rate: Decimal  # the share of the sync price a standard batch bills

    @property
    def duration(self):
        return timedelta(seconds=self.seconds)

    def multiplier(self, priority):
        """What a batch of this priority pays of the sync price on this window."""
        return EXPEDITED_MULTIPLIER if priority == "expedited" else self.rate

    def as_object(self):
        return {"window": self.name, "seconds": self.seconds, "rate": str(self.rate)}


@lru_cache(maxsize=8)
def _parsed(spec):
    return tuple(Window(name, seconds, Decimal(rate)) for name, seconds, rate in parse_windows(spec))


def offered():
    """The windows offered now, shortest first."""
    return _parsed(settings.OPENRELAY_COMPLETION_WINDOWS)


def names():
    return [window.name for window in offered()]


def get(name):
    """The offered window called `name`, or None."""
    return next((window for window in offered() if window.name == name), None)


def default():
    """The window a create that names none gets: 24h when offered (OpenAI's), else the longest."""
    return get(ANTHROPIC_WINDOW) or offered()[-1]


def parse(value, param="completion_window"):
    """A create's window by name -> the offered Window; a 400 naming the offered ones otherwise."""
    window = get(value) if isinstance(value, str) else None
    if window is None:
        raise invalid_choice(param, value, names(), hint="They are the completion windows offered here.")
    return window


def of_batch(batch):
    """The window a batch was created with (its name), as offered now or, if no longer offered, as it ran."""
    window = get(batch.completion_window)
    if window is not None:
        return window
    seconds = (batch.expires_at - batch.created_at).total_seconds()
    return Window(batch.completion_window, int(seconds), batch.price_multiplier)


def seconds_to_aim(seconds_left, window_s):
    """The time a batch with `seconds_left` of its `window_s` has to finish by the deadline rule: until
    DEADLINE_MARGIN of its window is left; at least a second (past that point, all it can get)."""
    return max(seconds_left - DEADLINE_MARGIN * window_s, 1.0)
