"""The API families the web layer answers in besides OpenAI's: which routes each owns (a path
prefix), how its error answers read, and which of its paths take a larger JSON body.

The web layer names no family: the app that serves one registers its dialect at start-up
(batches.apps registers the dialects of batches.endpoints), as Zulip's queue processors register
themselves. OpenAI's shapes are the default for every route no dialect claims.
"""

from collections.abc import Callable, Mapping
from typing import Any, Protocol


class WebDialect(Protocol):
    """What the web layer reads of a dialect (batches.endpoints.base.Dialect is one)."""

    @property
    def prefix(self) -> str | None: ...  # the routes it owns: this path and every path under it

    @property
    def envelope(self) -> Callable[[int, dict[str, Any], str | None], dict[str, Any]] | None: ...

    @property
    def body_caps(self) -> Mapping[str, str]: ...  # path -> the setting its JSON body may run to


_registered: list[WebDialect] = []


def register(dialect: WebDialect) -> None:
    """Answer the dialect's routes in its shapes; one without a prefix (OpenAI's) is the default already."""
    if dialect.prefix is not None and dialect not in _registered:
        _registered.append(dialect)


def owner(path: str) -> WebDialect | None:
    """The registered dialect whose routes hold `path`, or None (OpenAI's)."""
    for dialect in _registered:
        prefix = dialect.prefix
        if prefix is not None and (path == prefix or path.startswith(prefix + "/")):
            return dialect
    return None


def prefixes() -> tuple[str, ...]:
    """The path prefixes of the registered dialects (their routes live on the inference host)."""
    return tuple(dialect.prefix for dialect in _registered if dialect.prefix is not None)


def body_cap_setting(path: str) -> str | None:
    """The name of the setting that caps the JSON body of a request to `path`, where a dialect sets one."""
    dialect = owner(path)
    return dialect.body_caps.get(path) if dialect is not None else None
