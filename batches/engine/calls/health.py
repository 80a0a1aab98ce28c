"""Deployment health: which deployments are in the rotation, and whose fault a failed call is.

A deployment that fails under a call leaves the rotation at once: the
connection refused, reset or timed out, or a 502/503/504. Its records are
not written off: they wait at the model's gate for a healthy deployment, for
as long as their batch's window lasts. A probe (GET {base_url}/models with
the deployment's key) asks again with backoff, from FIRST_PROBE_S doubling to
OPENRELAY_PROBE_MAX_S, and puts it back once it answers. A real vLLM restart
takes minutes (loading the model), so a dead server is a pause, not a failure.

Some failures the probe can't see, so the deployment comes back only when a
real call succeeds: one held record's call, sent as a canary (one at a time,
with the same backoff between failed ones). They are
- a 401/403: a wrong upstream key is the operator's fault, never the
  record's, and never counts toward a record's failures (a server without a
  models route answers the probe 404 whatever the key);
- a run of 500s across different records with no 2xx between them: a proxy
  whose upstream is dead answers so (LiteLLM: 500 "Connection error"), while
  its own /models answers 200. The run's 500s are forgiven to its records; a
  record that alone draws 500s still fails alone, with the server's answer,
  at the caller's POISON_FAILURES (a canary's failure counts only against a
  record already suspected so);
- a probe answered 404/405 (no models route: it proves nothing).

Each engine keeps its own view (it learns from its own calls) and writes
every change to the Deployment row, where the admin shows it and where
other engines pick it up, so a new engine does not hammer a server another
one already found dead. An engine that picks up another's ejection for a
cause only a real call clears (the row's needs_canary) sends canaries too,
and forgives the 500s of its own run not yet judged: with several engines, a
record's 500 counts against it exactly as it would with one.
"""

import asyncio
import logging
import time

from django.conf import settings

from batches.engine.calls.transport import TransportError
from openrelay.lib.redaction import redact

logger = logging.getLogger("openrelay.engine")

FAILED_STATUSES = {502, 503, 504}
REFUSED_STATUSES = {401, 403}
# 5xx answers that are the server's final word, never a passing failure.
FINAL_SERVER_STATUSES = {501, 505}
FIRST_PROBE_S = 0.1
PROBE_TIMEOUT_S = 5.0
MAX_ERROR_CHARS = 300


def server_failed(result):
    """Why this call's result is the deployment's failure rather than the record's answer, or ""."""
    if result.kind == "unavailable":
        return result.message
    if result.kind == "response" and (
        result.status_code in FAILED_STATUSES or result.status_code in REFUSED_STATUSES or server_error(result)
    ):
        return _reason(result)
    return ""


def refused(result):
    return result.kind == "response" and result.status_code in REFUSED_STATUSES


def server_error(result):
    """A 500 (or another 5xx the server may get over): the record's answer only when it alone draws them."""
    status = result.status_code
    return (
        result.kind == "response"
        and status >= 500
        and status not in FAILED_STATUSES
        and status not in FINAL_SERVER_STATUSES
    )


def _reason(result):
    detail = ""
    if isinstance(result.body, dict) and isinstance(result.body.get("error"), dict):
        detail = str(result.body["error"].get("message") or "")
    return f"HTTP {result.status_code}" + (f": {detail}" if detail else "")


class Faults:
    """One call's failures that count against its record (ModelCaller.call's poison count)."""

    __slots__ = ("count",)

    def __init__(self):
        self.count = 0


def _error_text(text, upstream):
    """`text` without the deployment's key (upstream errors may quote it), cut to MAX_ERROR_CHARS."""
    return redact(text, upstream.secrets, MAX_ERROR_CHARS)


async def probe(upstream):
    """ "" when the deployment answers its models route like a live server with a valid key, None when
    it has no such route (404/405: only a real call can tell), else why not."""
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
    if response.status >= 500 or response.status in REFUSED_STATUSES:
        return f"The model server answered a probe with HTTP {response.status}."
    if response.status in (404, 405):
        return None
    return ""


class Health:
    """Takes failed deployments out of the rotation and probes them back in (or sends canaries).

    `on_change(upstream)` is called (in the loop) after every change, to
    persist it; `on_recovered()` after a deployment came back.
    """

    def __init__(self, on_change=None, on_recovered=None):
        self.on_change = on_change
        self.on_recovered = on_recovered
        self._probes = {}
        self._canaries = {}  # upstream -> the future its canary's outcome resolves (True: it succeeded)
        # upstream -> (when its run began, the Faults of the calls that drew a 500 there since): a 2xx
        # to a call sent after that ends the run (one sent before proves nothing of the server now).
        self._runs = {}

    def judge(self, gate, upstream, result, faults, canary, busy=False, sent=0.0):
        """Why the call that got `result` must be sent again, or "" when `result` is the record's answer.

        A failure that is the record's counts in `faults`; one that is the deployment's takes it out.
        `canary`: the call was the one let through to a deployment out of the rotation; `sent`:
        when it was sent (time.monotonic).
        """
        if result.ok:
            if self._runs and upstream in self._runs and sent > self._runs[upstream][0]:
                del self._runs[upstream]
            if canary:
                self._canary_done(upstream, True)
            return ""
        reason = "" if busy else server_failed(result)
        if canary:
            if not reason:
                self._reopen(gate, upstream)  # the record's own answer says nothing of the deployment
                return ""
            upstream.last_error = _error_text(reason, upstream)
            if faults.count and not refused(result):
                faults.count += 1  # a record already suspected: its failures as a canary count too
            self._canary_done(upstream, False)
        elif refused(result):
            self.failed(gate, upstream, reason, canary=True)
        elif server_error(result):
            if upstream.healthy:
                self._server_error(gate, upstream, faults, reason)
            elif not upstream.canary:
                faults.count += 1  # out for another reason (a 503, a dropped connection): this 500 is the record's
        elif reason:
            faults.count += 1
            self.failed(gate, upstream, reason)
        return reason

    def _server_error(self, gate, upstream, faults, reason):
        """A 500 counts against its record, until another record draws one there before any 2xx:
        then the run is the deployment's (its 500s are forgiven) and it leaves the rotation."""
        run = self._runs.setdefault(upstream, (time.monotonic(), []))[1]
        faults.count += 1
        run.append(faults)
        if any(other is not faults for other in run):
            for each in run:
                each.count -= 1
            self.failed(gate, upstream, f"{reason} (to {len({id(f) for f in run})} requests in a row)", canary=True)

    def adopt(self, gate, upstream, last_error, canary):
        """Another engine took the deployment out (its row says so): out here too. `canary`: it was
        for a cause only a real call clears (a run of 500s, a refusal), so this engine's own run of
        500s, not yet long enough to be judged here, was that cause too: its 500s are forgiven."""
        upstream.last_error = last_error
        if canary:
            upstream.canary = True
            for faults in self._runs.pop(upstream, (0, []))[1]:
                faults.count -= 1
        self.eject(gate, upstream, persist=False)

    def failed(self, gate, upstream, reason, canary=False):
        """Out of the rotation; `canary`: it comes back only when a real call succeeds."""
        upstream.last_error = _error_text(reason, upstream)
        if canary:
            upstream.canary = True
        if not upstream.healthy:
            return
        logger.warning("deployment %s leaves the rotation: %s", upstream.base_url, upstream.last_error)
        self.eject(gate, upstream)

    def eject(self, gate, upstream, persist=True):
        """Out of the rotation, probed until it answers. `persist=False`: the row says so already
        (another engine found it failing)."""
        upstream.healthy = False
        self._runs.pop(upstream, None)
        if persist:
            self._changed(upstream)
        if upstream not in self._probes:
            self._probes[upstream] = asyncio.create_task(self._probe(gate, upstream))

    async def _probe(self, gate, upstream):
        delay = FIRST_PROBE_S
        limit = settings.OPENRELAY_PROBE_MAX_S
        while True:
            await asyncio.sleep(delay)
            if upstream.canary:
                if await self._canary(gate, upstream):
                    break
            else:
                problem = await probe(upstream)
                if problem is None:
                    upstream.canary = True  # no models route: a canary next
                    continue
                if not problem:
                    break
                upstream.last_error = _error_text(problem, upstream)
            delay = min(delay * 2, limit)
        del self._probes[upstream]
        upstream.canary = False
        logger.warning("deployment %s is back in the rotation", upstream.base_url)
        upstream.healthy = True
        self._changed(upstream)
        gate.dispatch()
        if self.on_recovered:
            self.on_recovered()

    async def _canary(self, gate, upstream):
        """Let one call through to the deployment (the gate hands it to a waiting record); True when it
        succeeded. No record waiting: it waits for one (the engine claims for an open canary)."""
        outcome = self._canaries[upstream] = asyncio.get_running_loop().create_future()
        try:
            self._reopen(gate, upstream)
            return await outcome
        finally:
            self._canaries.pop(upstream, None)
            upstream.canary_open = False

    def _reopen(self, gate, upstream):
        outcome = self._canaries.get(upstream)
        if outcome is not None and not outcome.done():
            upstream.canary_open = True
            gate.dispatch()

    def _canary_done(self, upstream, succeeded):
        outcome = self._canaries.get(upstream)
        if outcome is not None and not outcome.done():
            outcome.set_result(succeeded)

    def canary_lost(self, gate, upstream):
        """The canary's call ended without an answer (cancelled): another waiting record may go."""
        self._reopen(gate, upstream)

    def forget(self, upstream):
        """The deployment was replaced or removed: stop probing it."""
        task = self._probes.pop(upstream, None)
        if task is not None:
            task.cancel()
        self._runs.pop(upstream, None)
        upstream.canary = upstream.canary_open = False

    def _changed(self, upstream):
        if self.on_change:
            self.on_change(upstream)

    async def close(self):
        tasks = list(self._probes.values())
        self._probes.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
