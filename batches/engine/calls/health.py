"""Deployment health: which deployments are in the rotation.

A deployment that fails under a call leaves the rotation at once: the
connection refused, reset or timed out, a 502/503/504, or a 401/403 (a
wrong upstream key is the operator's fault, never the record's). Its
records are not written off: they wait at the model's gate for a healthy
deployment, for as long as their batch's window lasts. A probe (GET
{base_url}/models with the deployment's key) asks again with backoff, from
FIRST_PROBE_S doubling to OPENRELAY_PROBE_MAX_S, and puts it back once it
answers. A real vLLM restart takes minutes (loading the model), so a dead
server is a pause, not a failure.

Each engine keeps its own view (it learns from its own calls) and writes
every change to the Deployment row, where the admin shows it and where
other engines pick it up, so a new engine does not hammer a server another
one already found dead.
"""

import asyncio
import logging

from django.conf import settings

from batches.engine.calls.transport import TransportError
from openrelay.lib.redaction import redact

logger = logging.getLogger("openrelay.engine")

FAILED_STATUSES = {401, 403, 502, 503, 504}
FIRST_PROBE_S = 0.1
PROBE_TIMEOUT_S = 5.0
MAX_ERROR_CHARS = 300


def server_failed(result):
    """Why this call's result means the deployment failed, or "" when it did not."""
    if result.kind == "unavailable":
        return result.message
    if result.kind == "response" and result.status_code in FAILED_STATUSES:
        detail = ""
        if isinstance(result.body, dict) and isinstance(result.body.get("error"), dict):
            detail = str(result.body["error"].get("message") or "")
        return f"HTTP {result.status_code}" + (f": {detail}" if detail else "")
    return ""


def _error_text(text, upstream):
    """`text` without the deployment's key (upstream errors may quote it), cut to MAX_ERROR_CHARS."""
    return redact(text, upstream.secrets, MAX_ERROR_CHARS)


async def probe(upstream):
    """ "" when the deployment answers its models route like a live server with a valid key, else why not."""
    try:
        head = upstream.head("/v1/models", "GET")
    except ValueError as exc:
        return f"The model server's settings are not usable: {exc}."
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            response = await upstream.origin.post(head, b"")
    except (TransportError, OSError) as exc:  # OSError covers TimeoutError
        reason = str(exc) if isinstance(exc, TransportError) and str(exc) else type(exc).__name__
        return f"The model server did not answer a probe: {reason}."
    if response.status >= 500 or response.status in (401, 403):
        return f"The model server answered a probe with HTTP {response.status}."
    return ""


class Health:
    """Takes failed deployments out of the rotation and probes them back in.

    `on_change(upstream)` is called (in the loop) after every change, to
    persist it; `on_recovered()` after a deployment came back.
    """

    def __init__(self, on_change=None, on_recovered=None):
        self.on_change = on_change
        self.on_recovered = on_recovered
        self._probes = {}

    def failed(self, gate, upstream, reason):
        upstream.last_error = _error_text(reason, upstream)
        if not upstream.healthy:
            return
        logger.warning("deployment %s leaves the rotation: %s", upstream.base_url, upstream.last_error)
        self.eject(gate, upstream)

    def eject(self, gate, upstream, persist=True):
        """Out of the rotation, probed until it answers. `persist=False`: the row says so already
        (another engine found it failing)."""
        upstream.healthy = False
        if persist:
            self._changed(upstream)
        if upstream not in self._probes:
            self._probes[upstream] = asyncio.create_task(self._probe(gate, upstream))

    async def _probe(self, gate, upstream):
        delay = FIRST_PROBE_S
        limit = settings.OPENRELAY_PROBE_MAX_S
        while True:
            await asyncio.sleep(delay)
            problem = await probe(upstream)
            if not problem:
                break
            upstream.last_error = _error_text(problem, upstream)
            delay = min(delay * 2, limit)
        del self._probes[upstream]
        logger.warning("deployment %s is back in the rotation", upstream.base_url)
        upstream.healthy = True
        self._changed(upstream)
        gate.dispatch()
        if self.on_recovered:
            self.on_recovered()

    def forget(self, upstream):
        """The deployment was replaced or removed: stop probing it."""
        task = self._probes.pop(upstream, None)
        if task is not None:
            task.cancel()

    def _changed(self, upstream):
        if self.on_change:
            self.on_change(upstream)

    async def close(self):
        tasks = list(self._probes.values())
        self._probes.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
