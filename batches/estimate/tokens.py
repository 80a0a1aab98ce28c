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
"""

import logging
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
from django.conf import settings

from batches.estimate.records import CHARS_PER_TOKEN
from openrelay.core.models import DeploymentHealth

logger = logging.getLogger("batches.estimate")

LLAMACPP = "llamacpp_input_tokens"
VLLM = "vllm_tokenize"
APPROXIMATION = "approximation"
# A record the template or tools could add tokens to is counted as the call is; other endpoints as text.
CHAT = "/v1/chat/completions"
TEXT_ENDPOINTS = ("/v1/completions", "/v1/embeddings")
# Tokenizer calls a quote keeps in flight: enough to hide round trips, few enough not to load a server.
TOKENIZER_CALLS_AT_ONCE = 8


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


def count_input(tally, deployments):
    """InputCount of the tally's records, by the first deployment whose tokenizer answers."""
    if not tally.records:
        return InputCount(0, APPROXIMATION, 0, 0, 0.0)
    problems = []
    timeout = httpx.Timeout(settings.OPENRELAY_ESTIMATE_TOKENIZER_TIMEOUT_S, connect=2.0)
    with httpx.Client(timeout=timeout) as client:
        for deployment in _in_rotation_first(deployments):
            try:
                method, exact = _count_sample(client, deployment, tally)
            except TokenizerUnavailable as exc:
                logger.info("quote: deployment %s counted no tokens: %s", deployment.pk, exc)
                problems.append(str(exc))
                continue
            return _scaled(tally, method, exact)
    return _approximation(tally, _why_approximate(problems))


def _in_rotation_first(deployments):
    return sorted(deployments, key=lambda d: (d.health != DeploymentHealth.HEALTHY, d.pk))


def _count_sample(client, deployment, tally):
    method, count, first = _tokenizer_of(client, deployment, tally.endpoint, tally.sample[0].body)
    # A few calls at once: 200 one after the other spent ~1 s waiting on a local server's round trips, 4 at
    # once ~0.6 s.
    with ThreadPoolExecutor(TOKENIZER_CALLS_AT_ONCE) as pool:
        return method, [first, *pool.map(count, (sampled.body for sampled in tally.sample[1:]))]


def _tokenizer_of(client, deployment, endpoint, body):
    """(method, count(body), count of `body`) for the first route the deployment's server answers,
    or TokenizerUnavailable."""
    routes = []
    if endpoint == CHAT:
        routes.append((LLAMACPP, _llamacpp_counter(client, deployment)))
    if endpoint == CHAT or endpoint in TEXT_ENDPOINTS:
        routes.append((VLLM, _vllm_counter(client, deployment, endpoint)))
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


def _post(client, url, deployment, payload):
    headers = {"Authorization": f"Bearer {deployment.api_key}"} if deployment.api_key else {}
    try:
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


def _llamacpp_counter(client, deployment):
    url = deployment.base_url.rstrip("/") + "/chat/completions/input_tokens"

    def count(body):
        payload = {key: value for key, value in body.items() if key != "openrelay"}
        payload["model"] = deployment.upstream_name
        return _integer(_post(client, url, deployment, payload), "input_tokens")

    return count


def _vllm_counter(client, deployment, endpoint):
    root = deployment.base_url.rstrip("/").removesuffix("/v1")
    url = root + "/tokenize"

    def count(body):
        if endpoint == CHAT:
            payload = {
                "model": deployment.upstream_name,
                "messages": body.get("messages"),
                "add_generation_prompt": True,
            }
            if body.get("tools"):
                payload["tools"] = body["tools"]
        else:
            text = body.get("prompt") if endpoint == "/v1/completions" else body.get("input")
            if not isinstance(text, str):
                raise TokenizerUnavailable("the tokenizer counts a prompt given as one string only")
            payload = {"model": deployment.upstream_name, "prompt": text}
        return _integer(_post(client, url, deployment, payload), "count")

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
