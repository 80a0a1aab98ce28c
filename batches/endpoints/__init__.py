"""The registry of endpoints: every endpoint a batch may call, keyed by path, and its API family.

Validation, the quote, the catalog and the engine ask here what an endpoint takes and answers
(`get(path)`), instead of spelling paths and branching on them. Adding an endpoint is one
`Endpoint` in its dialect's module and one line in `ENDPOINTS` below.
"""

from batches.endpoints.anthropic import ANTHROPIC, MESSAGES
from batches.endpoints.base import Dialect, Endpoint
from batches.endpoints.openai import CHAT, COMPLETIONS, EMBEDDINGS, MODERATIONS, OPENAI, RESPONSES

# In the order the API lists them (the create param's enum, the catalog, the dashboard's form).
ENDPOINTS = {endpoint.path: endpoint for endpoint in (CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES, MODERATIONS, MESSAGES)}
PATHS = tuple(ENDPOINTS)
DIALECTS = (OPENAI, ANTHROPIC)


def get(path: str) -> Endpoint:
    """The endpoint at `path`: one a batch was created with (validation checked it). KeyError for another."""
    return ENDPOINTS[path]


def dialect_of(path: str) -> Dialect | None:
    """The dialect of the endpoint at `path`, or None for a path no endpoint has (a server's own route)."""
    endpoint = ENDPOINTS.get(path)
    return endpoint.dialect if endpoint is not None else None


def paths_where(flag: str) -> tuple[str, ...]:
    """The paths of the endpoints whose boolean `flag` is set ("contracts", "tools"), in the registry's order."""
    return tuple(path for path, endpoint in ENDPOINTS.items() if getattr(endpoint, flag))


__all__ = ["DIALECTS", "ENDPOINTS", "PATHS", "Dialect", "Endpoint", "dialect_of", "get", "paths_where"]
