"""OpenRelay's body extensions: a record's `openrelay.tool_config` and
`openrelay.workflow`, checked and returned with defaults and caps applied. The
record checks call them at create and the engine again on the body it reads
back, so what runs is the clamped value. `RecordRejected`, the refusal of one
record, lives here at the bottom of the package because everything above
raises it: these checks, the record checks, the JSONL scan and the engine.
"""

from urllib.parse import urlsplit

from openrelay.api.params import invalid_choice, invalid_type, missing_parameter
from openrelay.lib.outbound import OutboundError, check_url

MAX_CALLBACK_URL = 2048

# name -> (default, cap). Omitted or 0 takes the default; above the cap is clamped.
TOOL_CONFIG_LIMITS = {"max_rounds": (8, 16), "timeout_ms": (30_000, 120_000)}
WORKFLOW_LIMITS = {
    "max_steps": (8, 64),
    "max_requests": (64, 1024),
    "max_tokens": (1_000_000, 10_000_000),
    "timeout_ms": (30_000, 120_000),
}
TOOL_TYPES = ("http", "mcp")
TOOL_CONFIG_PARAM = "body.openrelay.tool_config"
WORKFLOW_PARAM = "body.openrelay.workflow"
OPENRELAY_KEYS = ("tool_config", "workflow", "output_contract")


class RecordRejected(Exception):
    """One input record is refused; the batch goes on without it."""

    def __init__(self, code, message, param=None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param

    def as_error(self, line):
        return {"code": self.code, "message": self.message, "param": self.param, "line": line}


def normalize_tool_config(value):
    """Check `openrelay.tool_config` and return it with defaults and caps applied.

    The URL is only syntax-checked here; it is resolved and guarded when it is
    called, so a DNS change between create and run can't slip past the guard.
    """
    code, param = "invalid_tool_config", TOOL_CONFIG_PARAM
    _require_object(value, code, param)
    _reject_unknown_keys(value, ("type", "url", "authorization", "context", *TOOL_CONFIG_LIMITS), code, param)
    kind = value.get("type")
    if kind is None:
        kind = "http"
    if kind not in TOOL_TYPES:
        raise RecordRejected(code, invalid_choice(f"{param}.type", kind, TOOL_TYPES).message, f"{param}.type")
    return {"type": kind, **_callback_fields(value, code, param), **_limits(value, TOOL_CONFIG_LIMITS, code, param)}


def normalize_workflow(value):
    """Check `openrelay.workflow` (workflows.md) and return it with defaults and caps applied."""
    code, param = "invalid_workflow", WORKFLOW_PARAM
    _require_object(value, code, param)
    _reject_unknown_keys(value, ("url", "authorization", "context", *WORKFLOW_LIMITS), code, param)
    return {**_callback_fields(value, code, param), **_limits(value, WORKFLOW_LIMITS, code, param)}


def wrong_type(code, param, expected, value):
    return RecordRejected(code, invalid_type(param, expected, value).message, param)


def _require_object(value, code, param):
    if not isinstance(value, dict):
        raise wrong_type(code, param, "an object", value)


def _reject_unknown_keys(value, known, code, param):
    # A typo (say "max_round") would otherwise run silently with the default.
    for key in value:
        if key not in known:
            raise RecordRejected(code, f"Unknown parameter '{param}.{key}'.", f"{param}.{key}")


def _callback_fields(value, code, param):
    authorization = value.get("authorization")
    if authorization is not None and not isinstance(authorization, str):
        raise wrong_type(code, f"{param}.authorization", "a string", authorization)
    return {
        "url": _check_url(value.get("url"), code, f"{param}.url"),
        "authorization": authorization,
        "context": value.get("context"),
    }


def _check_url(url, code, param):
    if url is None:
        raise RecordRejected(code, missing_parameter(param).message, param)
    if not isinstance(url, str):
        raise wrong_type(code, param, "a string", url)
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:
        host, parts = None, None
    if parts is None and len(url) <= MAX_CALLBACK_URL:
        _refuse_host_form(url, code, param)  # "[name:with.colon]": the guard's own words
    if (
        parts is None
        or parts.scheme not in ("http", "https")
        or not host
        or len(url) > MAX_CALLBACK_URL
        or any(ch.isspace() for ch in url)
    ):
        raise RecordRejected(
            code,
            f"Invalid '{param}': expected an absolute http(s) URL with a host (at most {MAX_CALLBACK_URL} characters).",
            param,
        )
    _refuse_host_form(url, code, param)
    return url


def _refuse_host_form(url, code, param):
    """What the outbound guard refuses whatever the host resolves to (brackets holding no IPv6
    literal, an invalid IDNA label, a legacy numeric spelling), refused at create rather than
    failing the record when it runs. Addresses are still judged when the URL is called."""
    try:
        check_url(url, allow_private=True)
    except OutboundError as exc:
        raise RecordRejected(code, f"Invalid '{param}': {exc.message}.", param) from None


def _limits(value, limits, code, param):
    return {name: _bounded_int(value.get(name), *limits[name], code, f"{param}.{name}") for name in limits}


def _is_integral(value):
    # JSON has one number type, so 8.0 counts as the integer 8; booleans don't.
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or isinstance(value, float) and value.is_integer()


def _bounded_int(value, default, cap, code, param):
    if value is None or _is_integral(value) and value == 0:
        return default
    if not _is_integral(value):
        raise wrong_type(code, param, "an integer", value)
    if value < 0:
        raise RecordRejected(
            code, f"Invalid '{param}': expected a non-negative integer, but got {value} instead.", param
        )
    return min(int(value), cap)
