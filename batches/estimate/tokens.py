"""Input tokens by the deployment's own tokenizer where its server offers one, else a stated approximation.

Two tokenizer routes are known, tried in this order on each enabled
deployment of the model until one answers:
- llama.cpp's `POST /v1/chat/completions/input_tokens` takes the chat
  request itself and counts it as the call will (template, tools and all);
- vLLM's `POST /tokenize` (at the server's root) takes chat `messages` and
  applies the template, or a `prompt` string; it answers `count`.
(llama.cpp's own /tokenize counts raw text only, without the template, and
answers no `count`: it is not taken for one.)

A quote counts at most records.SAMPLE_SIZE records on the server; past that
it scales the sample to the whole with a regression on every record's local
count (exact = a + b * characters) and states the estimate's 95% error.
A server that is down, slow or says nothing useful leaves the approximation,
with a note saying why: a quote never fails on a tokenizer.

Every tokenizer call holds a slot of the deployment's own `max_concurrency`,
shared by every web process (`tokenizer_slots`: Redis, or file locks on one
host), so quotes at once never load a server past what its batches may: 48
quotes at once had up to 79 calls in flight against a cap of 8 (issue 56). A
quote waits OPENRELAY_ESTIMATE_TOKENIZER_WAIT_S in all for slots; past that it
is approximated, with a note, as for a slow server. A stored file's counts are
kept (`counted`): the same file quoted again on the same deployment asks the
server nothing.
"""

import contextlib
import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
from django.conf import settings

from batches import endpoints
from batches.estimate import counted
from batches.estimate.records import CHARS_PER_TOKEN
from openrelay.core.models import DeploymentHealth
from openrelay.lib import semaphores

logger = logging.getLogger("batches.estimate")

LLAMACPP = "llamacpp_input_tokens"
VLLM = "vllm_tokenize"
APPROXIMATION = "approximation"
# Tokenizer calls a quote keeps in flight (fewer when the deployment's cap is lower): enough to hide round
# trips. The deployment's slots bound every quote's together.
TOKENIZER_CALLS_AT_ONCE = 8
CONNECT_TIMEOUT_S = 2.0


class TokenizerUnavailable(Exception):
    """The deployment's server offers no usable tokenizer, or failed while counting."""


@dataclass
class InputCount:
    total: int
    method: str
    records: int
    counted: int  # records the tokenizer counted (all of them, or a sample)
    error_pct: float  # the total's 95% error in % (0: every record counted exactly)
    note: str | None = None

    def as_object(self):
        return {
            "total": self.total,
            "method": self.method,
            "records": self.records,
            "counted_records": self.counted,
            "sampled": 0 < self.counted < self.records,
            "error_pct": round(self.error_pct, 2),
            "note": self.note,
        }


def count_input(tally, deployments, *, file_id=None):
    """InputCount of the tally's records, by the first deployment whose tokenizer answers (or the counts
    one made of the stored file `file_id` before)."""
    if not tally.records:
        return InputCount(0, APPROXIMATION, 0, 0, 0.0)
    deployments = _in_rotation_first(deployments)
    kept = counted.lookup(file_id, deployments, tally) if file_id else None
    if kept is not None:
        return _scaled(tally, *kept)
    problems = []
    deadline = time.monotonic() + settings.OPENRELAY_ESTIMATE_TOKENIZER_WAIT_S
    timeout = httpx.Timeout(settings.OPENRELAY_ESTIMATE_TOKENIZER_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
    with httpx.Client(timeout=timeout) as client:
        for deployment in deployments:
            try:
                method, exact = _count_sample(client, deployment, tally, deadline)
            except TokenizerUnavailable as exc:
                logger.info("quote: deployment %s counted no tokens: %s", deployment.pk, exc)
                problems.append(str(exc))
                continue
            if file_id:
                counted.store(file_id, deployment, tally, method, exact)
            return _scaled(tally, method, exact)
    return _approximation(tally, _why_approximate(problems))


def tokenizer_slots(deployment):
    """The deployment's tokenizer slots: its max_concurrency, across every web process and host."""
    # A slot outlives its call only when the process died holding it (file locks free it at once);
    # the lease covers the slowest call that can end on its own: connect, send and answer.
    timeout = settings.OPENRELAY_ESTIMATE_TOKENIZER_TIMEOUT_S
    return semaphores.shared(
        f"tokenizer-{deployment.pk}-{deployment.created_at.timestamp():.6f}",
        deployment.max_concurrency,
        lease_s=CONNECT_TIMEOUT_S + 3 * timeout + 1,
    )


class _Slots:
    """A quote's way into its deployment's slots: every call holds one, all waits end at one deadline."""

    def __init__(self, deployment, deadline):
        try:
            self.semaphore = tokenizer_slots(deployment)
        except semaphores.Unavailable as exc:
            raise TokenizerUnavailable(f"the tokenizer's slots could not be read ({exc})") from None
        self.limit = max(1, deployment.max_concurrency)
        self.deadline = deadline

    @contextlib.contextmanager
    def held(self):
        try:
            slot = self.semaphore.acquire(self.deadline - time.monotonic())
        except semaphores.Unavailable as exc:  # count nothing rather than count past the cap
            raise TokenizerUnavailable(f"the tokenizer's slots could not be read ({exc})") from None
        if slot is None:
            waited = settings.OPENRELAY_ESTIMATE_TOKENIZER_WAIT_S
            raise TokenizerUnavailable(
                f"the model server's tokenizer is busy (none of its {self.limit} slots came free within "
                f"the quote's {waited:g} s)"
            )
        try:
            yield
        finally:
            slot.release()


def _in_rotation_first(deployments):
    return sorted(deployments, key=lambda d: (d.health != DeploymentHealth.HEALTHY, d.pk))


def _count_sample(client, deployment, tally, deadline):
    slots = _Slots(deployment, deadline)
    method, count, first = _tokenizer_of(client, slots, deployment, tally.endpoint, tally.sample[0].body)
    at_once = min(TOKENIZER_CALLS_AT_ONCE, slots.limit)
    return method, [first, *_count_all(count, [sampled.body for sampled in tally.sample[1:]], at_once)]


def _count_all(count, bodies, at_once):
    """count(body) for each body, `at_once` at a time; the first failure cancels the calls not started."""
    # A few calls at once: 200 one after the other spent ~1 s waiting on a local server's round trips, 4 at
    # once ~0.6 s.
    with ThreadPoolExecutor(at_once) as pool:
        futures = [pool.submit(count, body) for body in bodies]
        try:
            return [future.result() for future in futures]
        except BaseException:
            # A server down or busy answers the rest no better: don't send them (or wait for slots) one by one.
            for future in futures:
                future.cancel()
            raise


def _tokenizer_of(client, slots, deployment, endpoint, body):
    """(method, count(body), count of `body`) for the first route the deployment's server answers,
    or TokenizerUnavailable."""
    # A record the template or tools could add tokens to is counted as the call is; other endpoints as text.
    shape = endpoints.get(endpoint).tokenizer
    routes = []
    if shape == "chat":
        routes.append((LLAMACPP, _llamacpp_counter(client, slots, deployment)))
    if shape != "none":
        routes.append((VLLM, _vllm_counter(client, slots, deployment, endpoint)))
    if not routes:
        raise TokenizerUnavailable(f"no model server tokenizer counts {endpoint} requests")
    last = None
    for method, count in routes:
        try:
            return method, count, count(body)
        except _RouteMissing as exc:
            last = exc
    raise TokenizerUnavailable(str(last))


class _RouteMissing(TokenizerUnavailable):
    """This route isn't there (404, 405, an answer without a count): the next may be."""


def _post(client, slots, url, deployment, payload):
    headers = {"Authorization": f"Bearer {deployment.api_key}"} if deployment.api_key else {}
    try:
        with slots.held():
            response = client.post(url, json=payload, headers=headers)
    except httpx.HTTPError as exc:
        # Connection refused, a timeout: the server is down or slow, and no other route will answer either.
        raise TokenizerUnavailable(f"the model server did not answer ({type(exc).__name__})") from None
    if response.status_code in (404, 405, 501):
        raise _RouteMissing("the model server offers no tokenizer route")
    if response.status_code != 200:
        raise TokenizerUnavailable(f"the model server's tokenizer answered HTTP {response.status_code}")
    try:
        return response.json()
    except ValueError:
        raise _RouteMissing("the model server's tokenizer answered something other than JSON") from None


def _llamacpp_counter(client, slots, deployment):
    url = deployment.base_url.rstrip("/") + "/chat/completions/input_tokens"

    def count(body):
        payload = {key: value for key, value in body.items() if key != "openrelay"}
        payload["model"] = deployment.upstream_name
        return _integer(_post(client, slots, url, deployment, payload), "input_tokens")

    return count


def _vllm_counter(client, slots, deployment, endpoint):
    root = deployment.base_url.rstrip("/").removesuffix("/v1")
    url = root + "/tokenize"

    spec = endpoints.get(endpoint)

    def count(body):
        if spec.tokenizer == "chat":
            payload = {
                "model": deployment.upstream_name,
                "messages": body.get("messages"),
                "add_generation_prompt": True,
            }
            if body.get("tools"):
                payload["tools"] = body["tools"]
        else:
            text = body.get(spec.input_key)
            if not isinstance(text, str):
                raise TokenizerUnavailable("the tokenizer counts a prompt given as one string only")
            payload = {"model": deployment.upstream_name, "prompt": text}
        return _integer(_post(client, slots, url, deployment, payload), "count")

    return count


def _integer(answer, key):
    value = answer.get(key) if isinstance(answer, dict) else None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _RouteMissing(f"the model server's tokenizer answered no '{key}'")
    return value


def _scaled(tally, method, exact):
    n, total_records = len(exact), tally.records
    if n == total_records:
        return InputCount(sum(exact), method, total_records, n, 0.0)
    estimate, error = regression_total([s.chars for s in tally.sample], exact, tally.chars, total_records)
    return InputCount(round(estimate), method, total_records, n, error)


def regression_total(xs, ys, x_total, population):
    """The total of y over `population` records, from a simple random sample (xs, ys) and the
    population's total of x: the regression estimator, and its 95% error in % of the total.

    y = a + b x fits a tokenizer's count against characters well (a is the template's
    tokens a record, b the tokens a character), so the error falls with the residuals,
    not with y's own spread (Cochran, Sampling Techniques, 7.7).
    """
    n = len(xs)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    estimate = population * (mean_y + slope * (x_total / population - mean_x))
    residuals = [y - mean_y - slope * (x - mean_x) for x, y in zip(xs, ys)]
    variance = sum(r * r for r in residuals) / max(1, n - 2)
    standard_error = population * math.sqrt(max(0.0, 1 - n / population) * variance / n)
    error_pct = 196 * standard_error / estimate if estimate > 0 else 0.0
    return max(0.0, estimate), error_pct


def _approximation(tally, note):
    # No tokenizer: the approximation's error is what English prose shows against real tokenizers (±25%).
    return InputCount(tally.approx_tokens, APPROXIMATION, tally.records, 0, APPROXIMATION_ERROR_PCT, note)


APPROXIMATION_ERROR_PCT = 25.0


def _why_approximate(problems):
    rule = f"{CHARS_PER_TOKEN} characters a token"
    if not problems:
        return f"The model has no enabled deployment to count with; approximated at {rule}."
    return f"No tokenizer: {problems[-1]}; approximated at {rule}."
