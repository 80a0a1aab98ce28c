"""The one place that calls model servers.

It owns the call time limit (counted from when the request is sent, so time
the model server queues it counts), failover between deployments when a
server fails under a call, and 429 back-off. Everything above it (plain
records, tool loops, workflows) sees a `CallResult`.

The calls travel over batches.engine.calls.transport, a lean HTTP/1.1 client:
this is the hot path, and aiohttp's client (used for users' URLs, through
openrelay.lib.outbound) costs two to three times its CPU a call. An answer over
OPENRELAY_MAX_MODEL_RESPONSE_BYTES, or one the server stops sending for
OPENRELAY_MODEL_IDLE_TIMEOUT_S, is a failed server (the call runs again,
like after a dropped connection), not the record's answer.

What a model server says goes through openrelay.lib.redaction with the
deployment's key before it becomes a message or an error line.
"""

import asyncio
import logging
import random
import re
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import orjson

from batches import endpoints, tallies
from batches.engine.calls import answer_text, budget, messages
from batches.engine.calls.flow import FlowControl, MetricsReader
from batches.engine.calls.health import Faults, Health, server_error
from batches.engine.calls.transport import IdleTimeout, Origin, TransportError
from batches.engine.calls.usage import Usage  # the engine's modules import it from here too
from batches.engine.config import EngineConfig
from batches.engine.fairness import EXPRESS_PAUSE_S, CallGate, Held, OrgCaps, Ticket, first_send
from openrelay.lib.redaction import redact, redact_json, secrets_of

logger = logging.getLogger("openrelay.engine")

MAX_RETRY_AFTER_S = 60.0
# A call refused again and again while it is the engine's only one at a deployment waits twice as long
# each time (its slot kept: ModelCaller.call), up to this (or its Retry-After, if longer). The server is
# full of other engines' calls, whose ceilings hold it so for up to 45 s: at each 1 s Retry-After,
# one engine held at its floor drew a refusal a second, 6 of a traced run of row 18's 12.
LONE_WAIT_MAX_S = 4.0
# Answers that tell the adaptive limit (batches.engine.calls.flow) to back off.
OVERLOAD_STATUSES = (429, 503)
# A request in flight at this many server failures fails alone: it may be
# what takes the server down, or what the server can't answer (a "poison"
# record; caller._given_up gives its code).
POISON_FAILURES = 3
CONNECT_TIMEOUT_S = 30.0
# How late the call limit may cut a call: the watchdog looks this often
# (a twentieth of the limit, within these bounds).
MAX_WATCH_EVERY_S = 1.0
MIN_WATCH_EVERY_S = 0.01
MAX_RAW_ERROR_CHARS = 500
MAX_REQUEST_ID_CHARS = 200


SERVER_WORDS = "the model server"
# A URL runs on to the next space, quote or bracket: its path says no more than its host.
_URL_TAIL = r"""[^\s"'<>)\]]*"""


def _concealer(base_url, upstream_model, asked):
    """(a pattern matching what must not be shown, {upstream name: asked}) for one deployment."""
    try:
        parts = urlsplit(base_url)
        netloc, host = parts.netloc, parts.hostname or ""
    except ValueError:
        parts, netloc, host = None, "", ""
    alternatives = [re.escape(base_url) + _URL_TAIL]
    if parts is not None and netloc:
        alternatives.append(re.escape(f"{parts.scheme}://{netloc}") + _URL_TAIL)
    # Longest first: at one position the regex takes the first alternative that matches.
    words = sorted({w for w in (netloc, host) if w}, key=len, reverse=True)
    names = {}
    if upstream_model and upstream_model != asked:
        words = sorted([*words, upstream_model], key=len, reverse=True)
        names[upstream_model] = asked
    alternatives += [rf"(?<![\w.-]){re.escape(word)}(?![\w-])" for word in words]
    return re.compile("|".join(alternatives)), names


def _request_id():
    """A `req_` id for an answer that came without x-request-id.

    Unique, not secret: random.getrandbits costs a fraction of the
    os.urandom call behind openrelay.lib.ids.new_request_id, once per record.
    """
    return f"req_{random.getrandbits(128):032x}"


def _given_up(result, faults, failure):
    """The last result of a call whose record drew POISON_FAILURES failures: `record_fails_upstream`
    (the server's last answer kept) when they were the record's own (500s, or failures while the
    server answered others), else `upstream_error` (the server failed under it; it may be what took
    the server down)."""
    if server_error(result) or faults.proven:
        meanwhile = " while it answered other requests" if faults.proven else ""
        result.code = "record_fails_upstream"
        result.message = (
            f"The model server failed this request {faults.count} times{meanwhile} ({failure}); it is not sent again."
        )
        return result
    return CallResult(
        kind="unavailable",
        message=f"The model server failed {faults.count} times while this request was in flight "
        f"({failure}); it is not sent again.",
    )


@dataclass
class CallResult:
    """What one model call came to.

    kind: "response" (the server answered; see status_code), "time_limit"
    (stopped at the call limit; never billed) or "unavailable" (every attempt
    failed at the transport level).
    """

    kind: str
    status_code: int | None = None
    body: object = None  # the answer parsed, or a big 2xx one kept as text (answer_text.AnswerText)
    request_id: str = ""
    usage: Usage = field(default_factory=Usage)
    message: str = ""  # why a call that got no answer failed ("unavailable", "time_limit")
    retry_after: str = ""  # an overload answer's (429, 503) Retry-After header, as the server sent it
    overload: bool = False  # cut by the idle timeout or the call limit: the server may be overloaded
    code: str = ""  # the record's error code when the caller gave up on it (record_fails_upstream)

    @property
    def ok(self):
        return self.kind == "response" and self.status_code is not None and 200 <= self.status_code < 300


class Upstream:
    """A deployment as the engine needs it (no ORM objects inside the loop).

    `allotted` is this engine's part of the deployment's max_concurrency
    (the live engines split it, fairness.split); `share` the calls the gate
    may send it now: the adaptive limit (`flow`, batches.engine.calls.flow) within
    that part; `in_use` the calls in flight on it; `healthy` whether it is
    in the rotation (health.Health decides).
    """

    def __init__(
        self,
        base_url,
        upstream_model,
        api_key,
        concurrency,
        deployment_id=None,
        max_answer_bytes=None,
        adaptive=None,
        config=None,
        messages_api="translate",
        start=None,
    ):
        config = config or EngineConfig.read()
        self.base_url = base_url
        # Anthropic Messages records: "translate" to chat completions, or "native" (its own /v1/messages).
        self.messages_api = messages_api
        self.upstream_model = upstream_model
        self.api_key = api_key
        self.concurrency = max(1, concurrency)
        self.deployment_id = deployment_id
        self.flow = FlowControl(
            self.concurrency,
            adaptive=config.adaptive_concurrency if adaptive is None else adaptive,
            floor=config.concurrency_floor,
            # The engine's part of the start when the peers split it (Peers._reconcile), else all of it.
            start=config.concurrency_start if start is None else start,
            tolerance=config.latency_tolerance,
            line=config.queue_line,
            hold_s=config.ceiling_hold_s,
        )
        self.allotted = self.concurrency
        self.share = self.flow.limit
        self.part = 0  # the engine's split of max_concurrency, published before it becomes the share
        self.on_refused = None  # called with the upstream on a 503 the others should hear of (FlowControl.news)
        self.published = False
        self.in_use = 0
        # No call goes past the adaptive limit before this (time.monotonic): one that did was
        # refused (fairness.CallGate._express_upstream).
        self.express_from = 0.0
        # Busy answers in a row to a call that was the engine's only one here (ModelCaller.call: each
        # waits twice as long, LONE_WAIT_MAX_S at most); any other answer ends the row.
        self.lone_refusals = 0
        self.healthy = True
        self.canary = False  # out of the rotation until a neutral request succeeds (health.Health)
        self.health_seen_at = None  # when this engine last changed or read the deployment's health
        self.last_error = ""
        self.headers = {"Content-Type": "application/json"}
        if self.api_key:
            self.headers["Authorization"] = f"Bearer {self.api_key}"
        self.secrets = secrets_of(self.headers.get("Authorization"))
        if max_answer_bytes is None:
            max_answer_bytes = config.max_answer_bytes
        try:
            self.origin = Origin(self.base_url, connect_timeout_s=CONNECT_TIMEOUT_S, max_answer_bytes=max_answer_bytes)
        except ValueError as exc:
            # A deployment the admin mistyped fails its calls; it must not crash the engine.
            self.origin, self.problem = None, str(exc)
        self._heads = {}
        self._concealers = {}  # the catalog name asked for -> its pattern (Upstream.conceal)
        self.metrics = MetricsReader(self)
        # Prefix keys hash to a deployment by this (batches.engine.prefixes.home_of): the same on every engine.
        self.affinity_seed = str(deployment_id if deployment_id is not None else base_url).encode()

    def allot(self, calls):
        """This engine's part of max_concurrency is now `calls`: the adaptive limit stays within it."""
        self.allotted = calls
        self.flow.set_ceiling(calls)
        self.share = self.flow.limit

    def observed(self, seconds, in_flight, now):
        """An answer came after `seconds` with `in_flight` calls here: the limit may move."""
        flow = self.flow
        flow.observe(seconds, in_flight, now)
        self.share = flow.limit
        if self.metrics.task is None and flow.adaptive:
            self.metrics.ensure()

    def level_with(self, others):
        """Move the adaptive limit halfway to the other engines' (flow.FlowControl.level_with)."""
        self.flow.level_with(sum(others) / len(others))
        self.share = self.flow.limit

    def absorb(self, calls):
        self.flow.absorb(calls, self.in_use)
        self.share = self.flow.limit

    def overloaded(self, sent_at, now, status=None, sent_with=None):
        flow = self.flow
        flow.overloaded(sent_at, now, status, sent_with)
        self.share = flow.limit
        if flow.news:
            flow.news = False
            if self.on_refused is not None:
                self.on_refused(self)

    def peer_refused(self):
        """Another engine was just refused a call here (flow.FlowControl.peer_refused): the server is
        full, so no call goes past the limit here either for a while (refused_past_limit)."""
        now = time.monotonic()
        self.flow.peer_refused(self.in_use, now)
        self.share = self.flow.limit
        self.refused_past_limit(now)

    def refused_past_limit(self, now):
        """A call sent past the adaptive limit (fairness.EXPRESS_CALLS) drew an overload answer: the
        server holds no more than the limit's calls, so none goes past it for EXPRESS_PAUSE_S. The
        limit does not move: its own calls were taken, and they go on teaching it (FlowControl)."""
        self.express_from = now + EXPRESS_PAUSE_S

    @property
    def settings(self):
        """What a change of in the admin makes a new Upstream for (max_concurrency only moves the share)."""
        return (self.base_url, self.upstream_model, self.api_key, self.messages_api)

    def head(self, endpoint, method="POST"):
        """The prepared request head for an API endpoint ("/v1/chat/completions"). Raises ValueError."""
        head = self._heads.get((endpoint, method))
        if head is None:
            if self.origin is None:
                raise ValueError(self.problem)
            dialect = endpoints.dialect_of(endpoint)
            headers = dialect.upstream(self.headers, self.api_key) if dialect is not None else self.headers
            head = self._heads[(endpoint, method)] = self.origin.prepare(endpoint.removeprefix("/v1"), headers, method)
        return head

    def close(self):
        self.metrics.close()
        if self.origin is not None:
            self.origin.close()

    def conceal_result(self, result, asked):
        """A call's result with its body concealed (Upstream.conceal); the usage was read before."""
        if result.kind == "response":
            result.body = self.conceal(result.body, asked, ok=result.ok)
        return result

    def conceal(self, body, asked, ok):
        """An answer's body as a record may show it: naming `asked` (the catalog model the
        request named), never this deployment.

        A 2xx body's `model` is set to `asked` (servers report the name they were sent, or their
        own: llama.cpp gives the model file's path). Any other body is an error whose text may
        quote the upstream name, the deployment's URL or its host (proxies do); those are
        replaced. Only errors are searched: a success costs one key write.
        """
        if isinstance(body, answer_text.AnswerText):
            body.rename_model(asked)  # a 2xx answer kept as text (ModelCaller._send)
            return body
        if not isinstance(body, dict):
            return body
        if ok:
            if "model" in body:
                body["model"] = asked
            return body
        return orjson.loads(self.conceal_text(orjson.dumps(body).decode(), asked, in_json=True))

    def conceal_text(self, text, asked, in_json=False):
        """`text` with the upstream name replaced by `asked` and the deployment's URL and host
        by "the model server"."""
        pattern, names = self._concealer(asked)
        say = (lambda value: orjson.dumps(value).decode()[1:-1]) if in_json else str
        return pattern.sub(lambda match: say(names.get(match.group(0), SERVER_WORDS)), text)

    def _concealer(self, asked):
        found = self._concealers.get(asked)
        if found is None:
            found = self._concealers[asked] = _concealer(self.base_url, self.upstream_model, asked)
        return found


class _Slot:
    """A call's slot at the gate, given back once: when the call ends, or before, when its answer
    has to wait for room in the answer budget (budget.waits): the server has answered,
    and the slot goes to the next call in turn order (another organization's, perhaps)."""

    __slots__ = ("answered_at", "gate", "held", "ticket", "upstream")

    def __init__(self, gate, ticket, upstream):
        self.gate, self.ticket, self.upstream = gate, ticket, upstream
        self.held = True
        self.answered_at = None  # when its answer began to wait for room

    def answered(self):
        if self.answered_at is None:
            self.answered_at = time.monotonic()
        self.give_back()

    def give_back(self):
        if self.held:
            self.held = False
            self.gate.release(self.ticket, self.upstream)


class ModelCaller:
    """Calls one model through its deployments, over keep-alive connections to each.

    Every call takes a slot at the model's CallGate (fair between
    organizations and batches, within each deployment's share). A
    deployment that fails under a call leaves the rotation and is probed
    until it answers again, or sent one neutral canary request at a time
    (health.Health judges each result); the call waits for a healthy
    deployment and is sent again there. A request that counted
    POISON_FAILURES failures fails alone (it may be what takes the server
    down, or what the server can't answer). A 429, or a 503 with Retry-After, is the server saying
    "later": the call waits Retry-After and tries again, up to `retries`
    times. Every answer moves the deployment's adaptive limit
    (batches.engine.calls.flow); those and calls cut for time cut it.
    """

    def __init__(
        self,
        upstreams,
        *,
        time_limit_s,
        retries,
        backoff_base_s=0.25,
        gate=None,
        health=None,
        idle_timeout_s=None,
        leased=None,
        fence=None,
    ):
        if not upstreams and gate is None:
            raise ValueError("a model needs at least one deployment")
        self.gate = gate or CallGate(OrgCaps())
        if upstreams:
            self.gate.upstreams = list(upstreams)
        self.health = health or Health()
        self._own_health = health is None
        self.time_limit_s = time_limit_s
        if idle_timeout_s is None:
            idle_timeout_s = EngineConfig.read().idle_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.retries = retries
        self.backoff_base_s = backoff_base_s
        self._deadlines = {}  # the task of each call in flight -> when its limit runs out (loop time)
        self._cut = set()  # tasks the watchdog cancelled at their limit
        self._watchdog = None
        self._ticket = Ticket(0, 0)  # for calls made without one (tests, tools)
        # Whether the engine still holds its records (batches.engine.leases.Leases.live): a call
        # is not sent without it. A clock check, no database.
        self.leased = leased
        # When the engine last read the running batches (batches.engine.fence.StatusFence): a call goes
        # out only while that read is fresh, so a cancel's answer means no call of its batch leaves.
        self.fence = fence

    @property
    def upstreams(self):
        return self.gate.upstreams

    @property
    def capacity(self):
        return sum(u.share for u in self.upstreams)

    async def __aenter__(self):
        self._watchdog = asyncio.create_task(self._watch())
        return self

    async def __aexit__(self, *exc):
        self._watchdog.cancel()
        await asyncio.gather(self._watchdog, return_exceptions=True)
        if self._own_health:
            await self.health.close()
        for upstream in self.upstreams:
            upstream.close()

    async def _watch(self):
        """Cut calls that pass the time limit, and answers that went silent: one timer for every call in flight.

        An asyncio.timeout per call schedules and cancels a timer handle for
        each call; that cost ~9% of a call's CPU on the hot path (callgrind
        instruction counts), while the limit is minutes long and a cut a
        fraction of a second late changes nothing.
        """
        loop = asyncio.get_running_loop()
        shortest = min(self.time_limit_s, self.idle_timeout_s)
        every = min(MAX_WATCH_EVERY_S, max(MIN_WATCH_EVERY_S, shortest / 20))
        while True:
            await asyncio.sleep(every)
            now = loop.time()
            for task, deadline in list(self._deadlines.items()):
                if deadline <= now and task not in self._cut:
                    self._cut.add(task)
                    task.cancel()
            for upstream in self.upstreams:
                if upstream.origin is not None:
                    upstream.origin.cut_idle(now, self.idle_timeout_s)

    async def call(self, endpoint, body, ticket=None):
        """Send `body` to `endpoint` (e.g. "/v1/chat/completions") and return a CallResult."""
        ticket = ticket or self._ticket
        faults = Faults()
        busy = 0
        while True:
            upstream = await self.gate.acquire(ticket)
            sent, sent_with = time.monotonic(), upstream.in_use
            # Sent past the adaptive limit (an organization's first call, fairness.EXPRESS_CALLS):
            # flow control learns only from the calls its limit let go, not as if it were higher.
            past_limit = sent_with > upstream.share
            slot = _Slot(self.gate, ticket, upstream)
            waits = budget.waits.set(slot.answered)  # its answer waits for room: the slot goes back (budget.py)
            try:
                if self.fence is not None and not self.fence.fresh():
                    await self.fence.wait_fresh()  # a poll is due: its read stops a cancelled batch's calls
                if ticket.held:
                    raise Held  # its batch paused while the call waited for a slot: not sent
                self._check_leased()
                mark = first_send.get()
                if mark is not None:
                    # The record's first call: marked sent on its row before it goes out, so a
                    # take-over knows it was in flight (fairness.first_send).
                    first_send.set(None)
                    await mark()  # checkpoints.LeaseLost when fenced meanwhile: the record is another engine's
                    # The mark waited on the database thread, behind a trip perhaps, or the process was
                    # stopped meanwhile: the leases may have lapsed since the check above.
                    self._check_leased()
                result = await self._attempt(upstream, endpoint, body)
            except BaseException:
                slot.give_back()
                raise
            finally:
                budget.waits.reset(waits)
            now = time.monotonic()
            # Before the slot goes back, so the gate hands out slots by the limit it leads to. An
            # answer that waited for room in the answer budget took the server until it came.
            if result.overload or (result.kind == "response" and result.status_code in OVERLOAD_STATUSES):
                if past_limit:
                    upstream.refused_past_limit(now)
                else:
                    upstream.overloaded(sent, now, result.status_code, sent_with)
            elif result.kind == "response" and not past_limit:
                answered = slot.answered_at or now
                upstream.observed(answered - sent, upstream.in_use, answered)
            # A 503 that says when to come back is an overloaded server, like a 429; without
            # Retry-After it is a failed one (a proxy whose backend is down answers so).
            busy_answer = result.status_code == 429 or (result.status_code == 503 and result.retry_after)
            # A busy answer to the engine's only call there: the server is full of other callers' calls,
            # and the next call in the slot would be refused too (an engine held at its floor, 1, sent
            # four in 3 ms, each refused: issue 55). The call keeps its slot through its wait, so the
            # engine sends nothing more there until this call goes again.
            lone = busy_answer and sent_with == 1
            upstream.lone_refusals = upstream.lone_refusals + 1 if lone else 0
            if not lone:
                slot.give_back()
            try:
                tallies.call(upstream.deployment_id, result, now - sent)
                failure = self.health.judge(
                    self.gate, upstream, result, faults, busy_answer, sent, ticket.organization_id
                )
                if failure:
                    slot.give_back()
                    await self.health.settled(upstream)  # a run being judged: its verdict decides what counted
                    if faults.count >= POISON_FAILURES:
                        return _given_up(result, faults, failure)
                    continue  # the gate hands out only healthy deployments: this waits for one
                if busy_answer and busy < self.retries:
                    busy += 1
                    delay = self._delay(result, busy)
                    if lone:
                        delay = min(delay * 2 ** (upstream.lone_refusals - 1), max(delay, LONE_WAIT_MAX_S))
                    await asyncio.sleep(delay)
                    continue
                return result
            finally:
                slot.give_back()

    def _check_leased(self):
        """Held while the engine's leases are in doubt: another engine may run this record.

        Checked before the mark, after it, and once the request's connection is at hand (_send):
        each is a wait a stopped process (SIGSTOP) can be thawed from a lease or more later. Thawed
        after 3 leases, a host sent 2 calls from past the first check that its take-over had sent."""
        if self.leased is not None and not self.leased():
            raise Held

    def _delay(self, result, attempt):
        if result.retry_after:
            try:
                return min(MAX_RETRY_AFTER_S, max(0.0, float(result.retry_after)))
            except ValueError:
                pass
        backoff = min(8.0, self.backoff_base_s * (2 ** (attempt - 1)))
        return backoff * (0.5 + random.random() / 2)

    async def _attempt(self, upstream, endpoint, body):
        asked = body.get("model")
        payload = dict(body)
        payload["model"] = upstream.upstream_model
        dialect = endpoint == messages.MESSAGES
        if dialect and upstream.messages_api != "native":
            endpoint, payload = messages.CHAT, messages.chat_request(payload)
        result = await self._attempt_at(upstream, endpoint, payload, asked)
        return messages.as_message(result, asked, body, translated=endpoint == messages.CHAT) if dialect else result

    async def _attempt_at(self, upstream, endpoint, payload, asked):
        try:
            head = upstream.head(endpoint)
        except ValueError as exc:
            return CallResult(
                kind="unavailable",
                message=upstream.conceal_text(f"The model server's settings are not usable: {exc}.", asked),
            )
        # The limit starts here, when the request is sent: time spent queued
        # inside the model server counts, our own queue does not.
        task = asyncio.current_task()
        self._deadlines[task] = asyncio.get_running_loop().time() + self.time_limit_s
        try:
            return upstream.conceal_result(await self._send(upstream, head, payload), asked)
        except asyncio.CancelledError:
            # Ours (the watchdog's) unless someone else cancelled the task too.
            if task in self._cut:
                self._cut.discard(task)
                if task.uncancel() == 0:
                    return CallResult(
                        kind="time_limit",
                        overload=True,
                        message=f"The model call did not return within {self.time_limit_s:g} seconds.",
                    )
            raise
        except (TransportError, OSError) as exc:  # OSError covers TimeoutError, e.g. connecting timed out
            result = self._failed(upstream, exc)
            result.overload = isinstance(exc, IdleTimeout)
            return result
        finally:
            del self._deadlines[task]
            if task in self._cut:  # cut, but the call ended another way: take the cancel back
                self._cut.discard(task)
                task.uncancel()

    @staticmethod
    def _failed(upstream, exc):
        # A TransportError's text is the transport's own; an OSError's may quote the peer: its name is enough.
        reason = str(exc) if isinstance(exc, TransportError) and str(exc) else type(exc).__name__
        reason = redact(reason, upstream.secrets)
        logger.info("model server at %s failed under a call: %s", upstream.base_url, reason)
        return CallResult(kind="unavailable", message=f"The model server failed: {reason}.")

    async def _send(self, upstream, head, payload):
        # The last check right before the bytes leave: after it nothing waits (transport.Origin.post).
        response = await upstream.origin.post(head, orjson.dumps(payload), self._check_leased)
        raw, status = response.body, response.status
        request_id = response.headers.get("x-request-id")
        if request_id is None:
            request_id = _request_id()
        elif upstream.secrets:
            # It goes to the result file as the server wrote it: a server may echo the key there too (~3 µs).
            request_id = redact(request_id, upstream.secrets, MAX_REQUEST_ID_CHARS)
        retry_after = response.headers.get("retry-after", "") if status in OVERLOAD_STATUSES else ""
        if 200 <= status < 300 and len(raw) > answer_text.BIG_BYTES and answer_text.wanted.get():
            kept = answer_text.read(raw)
            if kept is not None:
                usage = Usage.from_body(kept.head)
                return CallResult(kind="response", status_code=status, body=kept, request_id=request_id, usage=usage)
        try:
            parsed = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            parsed = None
        if parsed is None and 200 <= status < 300:
            return CallResult(kind="unavailable", message="The model server answered with a body that is not JSON.")
        if parsed is None:
            message = redact(raw.decode("utf-8", "replace"), upstream.secrets, MAX_RAW_ERROR_CHARS)
            parsed = {"error": {"message": message, "type": "upstream_error", "param": None, "code": None}}
        elif not 200 <= status < 300:
            # An error answer is stored as the record's result: a server that quotes the key must not hand it on.
            parsed = redact_json(parsed, upstream.secrets)
        return CallResult(
            kind="response",
            status_code=status,
            body=parsed,
            request_id=request_id,
            usage=Usage.from_body(parsed) if 200 <= status < 300 else Usage(),
            retry_after=retry_after,
        )
