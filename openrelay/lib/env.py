"""Small helpers that read settings from the environment and fail loudly.

A typo in a production variable should stop the process at start-up, not
surface as a strange default hours later.
"""

import os


class ImproperlyConfiguredEnv(ValueError):
    pass


# SECRET_KEY when none is set (a checkout, `manage.py up`): printed here, so it guards nothing and the
# JSON logs (openrelay.lib.logs) do not treat it as a secret.
DEV_SECRET_KEY = "openrelay-development-secret-key-change-me"

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def envstr(name, default=""):
    return os.environ.get(name, default)


def envbool(name, default=False):
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfiguredEnv(f"{name} must be a boolean (true/false), got {raw!r}")


def envint(name, default, *, minimum=None):
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfiguredEnv(f"{name} must be an integer, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfiguredEnv(f"{name} must be >= {minimum}, got {value}")
    return value


def envfloat(name, default, *, minimum=None):
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfiguredEnv(f"{name} must be a number, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfiguredEnv(f"{name} must be >= {minimum}, got {value}")
    return value


def envlist(name, default=()):
    raw = os.environ.get(name)
    if raw is None:
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


_RATE_PERIODS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}


def parse_rate(rate):
    """'2000/hour' -> (2000, 3600). Periods: second, minute, hour, day (or s, m, h, d)."""
    count, _, period = str(rate).partition("/")
    period = period.strip().lower()
    seconds = next((s for name, s in _RATE_PERIODS.items() if period in (name, name[0], name + "s")), None)
    try:
        number = int(count)
    except ValueError:
        number = 0
    if seconds is None or number < 1:
        raise ValueError(f"expected a rate like '2000/hour' (N/second|minute|hour|day), got {rate!r}")
    return number, seconds


def _checked(name, default, parse):
    """The variable as written (stripped), once `parse` accepts it at start-up; `default` when unset."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        parse(raw)
    except ValueError as exc:
        raise ImproperlyConfiguredEnv(f"{name}: {exc}") from None
    return raw.strip()


def envrate(name, default):
    """A rate such as '2000/hour', checked at start-up."""
    return _checked(name, default, parse_rate)


_WINDOW_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_windows(spec):
    """'1h:0.8,24h:0.5' -> ((name, seconds, rate as a str), ...) shortest first: the completion windows
    an operator offers, each with the share of the sync price it bills. Units s, m, h, d; a rate in (0, 1]."""
    windows = {}
    for item in str(spec).split(","):
        name, _, rate = item.strip().partition(":")
        name = name.strip()
        unit = _WINDOW_UNITS.get(name[-1:])
        count = name[:-1]
        if unit is None or not count.isdigit() or int(count) < 1 or len(name) > 8:
            raise ValueError(f"expected windows like '1h:0.8,24h:0.5' (N s|m|h|d : rate), got {item.strip()!r}")
        try:
            share = float(rate)
        except ValueError:
            share = -1.0
        # Two places at most: a batch keeps its multiplier in a column of two (Batch.price_multiplier).
        if not 0 < share <= 1 or len(rate.strip().partition(".")[2]) > 2:
            raise ValueError(
                f"window {name!r}: expected a rate above 0 and at most 1, in hundredths, got {rate.strip()!r}"
            )
        if name in windows:
            raise ValueError(f"window {name!r} is given twice")
        windows[name] = (name, int(count) * unit, rate.strip())
    return tuple(sorted(windows.values(), key=lambda window: window[1]))


def envwindows(name, default):
    """Completion windows with their rates (parse_windows), checked at start-up; kept as written."""
    return _checked(name, default, parse_windows)
