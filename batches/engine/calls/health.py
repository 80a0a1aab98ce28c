"""Deployment health: which deployments are in the rotation, and whose fault a failed call is.

A deployment that fails under calls leaves the rotation: the connection
refused, reset or timed out, or a 502/503/504 (below: whose failure it is).
Its records are not written off: they wait at the model's gate for a
healthy deployment, for as long as their batch's window lasts. A probe (GET {base_url}/models with the
deployment's key) asks again with backoff, from FIRST_PROBE_S doubling to
OPENRELAY_PROBE_MAX_S, and puts it back once it answers. A real vLLM restart
takes minutes (loading the model), so a dead server is a pause, not a failure.

A failure that follows a record is the record's. Issue 56: one tenant's 60
records whose prompt drew HTTP 500 held a shared deployment out of the
rotation for every tenant for 3 min (as long as they stayed queued), and
never failed, as their 500s were forgiven and they were the canaries. So a
failure that may be the server's (a 500; a dropped call, a 502-504 or a 503
without Retry-After) counts against its record, and
- one that came while the server answered another organization's call (a
  2xx that arrived while it was in flight) is the record's at once
  (`Faults.proven`);
- otherwise it joins the deployment's run (failures with no 2xx between
  them), judged by a neutral request (`ask`: a one-token chat completion no
  tenant wrote; from a run's first dropped call, or its second 500) while
  the run's records wait for the verdict. Failed too, the run is the
  deployment's: it leaves the rotation and the run's 500s are forgiven to
  their records. Answered, or a 2xx to any call sent after the run began,
  and the failures are their records'. A neutral request that says nothing
  (busy, or no answer in ASK_TIMEOUT_S) leaves it to the run: the
  deployment's only when it spans more than one organization.
A record whose failures counted POISON_FAILURES times fails alone
(batches.engine.calls.caller): `record_fails_upstream`, the server's last
answer kept, when they were its own.

Some failures the probe can't see, so a deployment out for them comes back
only when a neutral request succeeds (a canary: one at a time, with the same
backoff; never a tenant's record, so no tenant's records can keep it out).
They are
- a 401/403: a wrong upstream key is the operator's fault, never the
  record's, and never counts toward a record's failures (a server without a
  models route answers the probe 404 whatever the key);
- a run of 500s judged the deployment's: a proxy whose upstream is dead
  answers so (LiteLLM: 500 "Connection error"), while its own /models
  answers 200;
- any run whose neutral request the server failed with an HTTP answer (a
  5xx, a refusal): it talks HTTP, so its /models may answer 200 all the same
  (a run begun by a dropped call behind that proxy);
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

import orjson
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
# A neutral request queues inside the server like any call (a busy vLLM starts it when a slot
# frees); the run's records wait for its verdict meanwhile, unless a 2xx comes first.
ASK_TIMEOUT_S = 30.0
# Every deployment serves chat completions (the catalog's contract); one token costs the least.
NEUTRAL_PATH = "/v1/chat/completions"
NEUTRAL_REQUEST = {"messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 1}
MAX_ERROR_CHARS = 300


def server_failed(result):
    """Why this call's result is the deployment's failure rather than the record's answer, or ""."""
    if result.kind == "unavailable":
        return result.message
    if result.kind == "response" and (
        result.status_code in FAILED_STATUSES or result.status_code in REFUSED_STATUSES or server_error(result)
    ):
        return _reason(result.status_code, result.body)
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


def _reason(status, body):
    detail = ""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        detail = str(body["error"].get("message") or "")
    return f"HTTP {status}" + (f": {detail}" if detail else "")


class Faults:
    """One call's failures that count against its record (ModelCaller.call's poison count); `proven`:
    one came while the server answered others, so the record, not the server, draws them."""

    __slots__ = ("count", "proven")

    def __init__(self):
        self.count = 0
        self.proven = False


class Run:
    """Failures at one deployment with no 2xx between them, and the neutral request that judges them."""

    __slots__ = ("began", "faults", "forgivable", "orgs", "verdict", "settled")

    def __init__(self):
        self.began = time.monotonic()
        self.faults = []  # the Faults of each call that failed in it (a record's twice if it failed twice)
        self.forgivable = []  # those of the calls that drew a 500
        self.orgs = set()
        self.verdict = None  # the task asking the neutral request
        self.settled = asyncio.Event()


def _error_text(text, upstream):
    """`text` without the deployment's key (upstream errors may quote it), cut to MAX_ERROR_CHARS."""
    return redact(text, upstream.secrets, MAX_ERROR_CHARS)


def _transport_reason(exc):
    # A TransportError's text is the transport's own; an OSError's may quote the peer: its name is enough.
    return str(exc) if isinstance(exc, TransportError) and str(exc) else type(exc).__name__


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
        return f"The model server did not answer a probe: {_transport_reason(exc)}."
    if response.status >= 500 or response.status in REFUSED_STATUSES:
        return f"The model server answered a probe with HTTP {response.status}."
    if response.status in (404, 405):
        return None
    return ""


async def ask(upstream):
    """Send the neutral request: "" when the server answered it (any answer but a failed server's),
    None when that says nothing (busy, or no answer within ASK_TIMEOUT_S), else why it failed."""
    return (await _ask(upstream)).problem


class Asked:
    """What the neutral request came to: `problem` as `ask` gives it; `answered`: the server
    failed it with an HTTP answer (a 5xx, a refusal), so it talks HTTP and its /models may
    answer 200 all the same: only another neutral request can tell when it serves again."""

    __slots__ = ("problem", "answered")

    def __init__(self, problem, answered=False):
        self.problem = problem
        self.answered = answered


async def _ask(upstream):
    try:
        head = upstream.head(NEUTRAL_PATH)
    except ValueError as exc:
        return Asked(f"The model server's settings are not usable: {exc}.")
    body = orjson.dumps({"model": upstream.upstream_model, **NEUTRAL_REQUEST})
    try:
        async with asyncio.timeout(ASK_TIMEOUT_S):
            response = await upstream.origin.post(head, body)
    except TimeoutError:
        return Asked(None)
    except (TransportError, OSError) as exc:
        return Asked(f"The model server failed a neutral request: {_transport_reason(exc)}.")
    status = response.status
    if status == 429 or (status == 503 and response.headers.get("retry-after")):
        return Asked(None)
    if status in REFUSED_STATUSES or (status >= 500 and status not in FINAL_SERVER_STATUSES):
        try:
            parsed = orjson.loads(response.body)
        except orjson.JSONDecodeError:
            parsed = None
        return Asked(_reason(status, parsed), answered=True)
    return Asked("")


class Health:
    """Takes failed deployments out of the rotation and probes them back in (or sends canaries).

    `on_change(upstream)` is called (in the loop) after every change, to
    persist it; `on_recovered()` after a deployment came back.
    """

    def __init__(self, on_change=None, on_recovered=None):
        self.on_change = on_change
        self.on_recovered = on_recovered
        self._probes = {}
        self._runs = {}  # upstream -> its Run of failures not judged yet
        # upstream -> {organization id: when a 2xx to its call there last arrived (time.monotonic)}
        self._answered = {}

    def judge(self, gate, upstream, result, faults, busy=False, sent=0.0, org=0):
        """Why the call that got `result` must be sent again, or "" when `result` is the record's answer.

        A failure that is the record's counts in `faults`; one that is the deployment's takes it out.
        `sent`: when the call was sent (time.monotonic); `org`: the organization whose call it was.
        A caller sending a call again awaits `settled` first.
        """
        if result.ok:
            self._answered_by(upstream, org, sent)
            return ""
        reason = "" if busy else server_failed(result)
        if not reason:
            return ""
        if refused(result):
            self.failed(gate, upstream, reason, canary=True)
        elif server_error(result):
            if upstream.healthy:
                faults.count += 1
                self._suspect(gate, upstream, faults, reason, org, forgivable=True)
            elif not upstream.canary:
                faults.count += 1  # out for another reason (a 503, a dropped connection): this 500 is the record's
        else:
            faults.count += 1
            if not upstream.healthy:
                self.failed(gate, upstream, reason)
            elif self._answered_others(upstream, org, sent):
                faults.proven = True  # another organization's call was answered meanwhile: the server is up
            else:
                self._suspect(gate, upstream, faults, reason, org, forgivable=False)
        return reason

    async def settled(self, upstream):
        """Once the verdict on the deployment's run is in, if a neutral request is out for one."""
        run = self._runs.get(upstream)
        if run is not None and run.verdict is not None:
            await run.settled.wait()

    def _answered_by(self, upstream, org, sent):
        """A 2xx: the server works. It ends a run begun before the call was sent: those failures were their records'."""
        answered = self._answered.get(upstream)
        if answered is None:
            answered = self._answered[upstream] = {}
        answered[org] = time.monotonic()
        if self._runs:
            run = self._runs.get(upstream)
            if run is not None and sent > run.began:
                self._blame(upstream, run)

    def _answered_others(self, upstream, org, sent):
        """Whether another organization's call there was answered 2xx since `sent`."""
        return any(when > sent for who, when in self._answered.get(upstream, {}).items() if who != org)

    def _suspect(self, gate, upstream, faults, reason, org, forgivable):
        """A failure that may be the server's joins its run; a neutral request judges whose the run is,
        from its first dropped call (or 502-504) or its second 500 on. `forgivable`: a 500, forgiven
        to its record if the run is the deployment's (a dropped call counts all the same: it may be
        what takes the server down)."""
        run = self._runs.get(upstream)
        if run is None:
            run = self._runs[upstream] = Run()
        run.faults.append(faults)
        run.orgs.add(org)
        if forgivable:
            run.forgivable.append(faults)
        if run.verdict is None and (len(run.faults) > 1 or not forgivable):
            run.verdict = asyncio.create_task(self._judge_run(gate, upstream, run, reason))

    async def _judge_run(self, gate, upstream, run, reason):
        try:
            asked = await _ask(upstream)
        except Exception:  # the run's records wait for a verdict: an unforeseen error must still give one
            logger.exception("the neutral request to %s failed unexpectedly", upstream.base_url)
            asked = Asked(None)
        problem = asked.problem
        if self._runs.get(upstream) is not run:
            return  # a 2xx, an ejection or another engine's verdict came first
        if problem or (problem is None and len(run.orgs) > 1):
            self._forgive(run)
            calls = len({id(f) for f in run.faults})
            # Out until a neutral request succeeds if the run drew 500s or the neutral request an HTTP
            # failure: its /models may answer all the same. Issue 55: a run begun by a dropped call,
            # whose neutral request drew a dead upstream's 500, left for the probe; /models put it back
            # at once, and the 500s its records drew meanwhile counted (1 of 50 written off).
            canary = bool(run.forgivable) or asked.answered
            self.failed(gate, upstream, f"{reason} (to {calls} requests in a row, and to a neutral request)", canary)
        elif problem == "":
            self._blame(upstream, run)
        else:
            self._end_run(upstream)  # one organization's, and the server said nothing: the records' own count stands

    def _blame(self, upstream, run):
        """The server answers: the run's failures are their records'."""
        for faults in run.faults:
            faults.proven = True
        self._end_run(upstream)

    @staticmethod
    def _forgive(run):
        for faults in run.forgivable:
            faults.count -= 1

    def _end_run(self, upstream):
        run = self._runs.pop(upstream, None)
        if run is not None:
            run.settled.set()
            if run.verdict is not None and run.verdict is not asyncio.current_task():
                run.verdict.cancel()

    def adopt(self, gate, upstream, last_error, canary):
        """Another engine took the deployment out (its row says so): out here too. `canary`: it was
        for a cause only a real call clears (a run of 500s, a refusal), so this engine's own run of
        500s, not judged yet here, was that cause too: its 500s are forgiven."""
        upstream.last_error = last_error
        if canary:
            upstream.canary = True
            run = self._runs.get(upstream)
            if run is not None:
                self._forgive(run)
        self.eject(gate, upstream, persist=False)

    def failed(self, gate, upstream, reason, canary=False):
        """Out of the rotation; `canary`: it comes back only when a neutral request succeeds."""
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
        self._end_run(upstream)
        if persist:
            self._changed(upstream)
        if upstream not in self._probes:
            self._probes[upstream] = asyncio.create_task(self._probe(gate, upstream))

    async def _probe(self, gate, upstream):
        delay = FIRST_PROBE_S
        limit = settings.OPENRELAY_PROBE_MAX_S
        while True:
            await asyncio.sleep(delay)
            # A canary is the neutral request, one at a time: never a tenant's record, which could fail it
            # every time (issue 56: one tenant's queued records held a deployment out for 3 min).
            canary = upstream.canary
            problem = await (ask(upstream) if canary else probe(upstream))
            if problem is None and not canary:
                upstream.canary = True  # no models route: a canary next
                continue
            if problem == "":
                break
            if problem:
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

    def forget(self, upstream):
        """The deployment was replaced or removed: stop probing it."""
        task = self._probes.pop(upstream, None)
        if task is not None:
            task.cancel()
        self._end_run(upstream)
        self._answered.pop(upstream, None)
        upstream.canary = False

    def _changed(self, upstream):
        if self.on_change:
            self.on_change(upstream)

    async def close(self):
        tasks = list(self._probes.values()) + [run.verdict for run in self._runs.values() if run.verdict]
        self._probes.clear()
        for upstream in list(self._runs):
            self._end_run(upstream)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
