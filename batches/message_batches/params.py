"""The body of `POST /v1/messages/batches`: `{"requests": [{"custom_id", "params"}, ...]}`.

What makes the whole request unusable is a 400 here (no requests, too many, a custom_id that is
not 1-64 characters or is used twice, a request that is not `{custom_id, params}`), and so is a
request whose `params` have a shape Anthropic refuses (check_params, with the catalog: an unknown
model, a max_tokens past the model's cap, messages that are not a list of turns...): refused at
create, they would only fail one by one. What needs the batch as a whole (a second model, the
`openrelay` extensions) is checked as every batch's records are (batches.validation.records) and
comes back as an `errored` result.
"""

from batches import windows
from batches.endpoints import anthropic
from batches.validation import messages
from batches.validation.params import ADMISSIONS
from openrelay.api.errors import ApiError
from openrelay.api.params import invalid_choice, invalid_type, missing_parameter
from openrelay.lib.wording import shown

MESSAGES = anthropic.MESSAGES.path
# Anthropic's limits: 100,000 requests (or 256 MB) a batch, custom_ids of 1-64 characters.
MAX_REQUESTS = 100_000
MAX_CUSTOM_ID = 64
REQUEST_KEYS = ("custom_id", "params")
BODY_KEYS = ("requests", "openrelay")  # openrelay: OpenRelay's extension (OPENRELAY_KEYS), not Anthropic's
OPENRELAY_KEYS = ("completion_window", "admission")


def parse_requests(data):
    """The create body's requests as batch input lines ({custom_id, method, url, body}); ApiError on the first problem."""
    if not isinstance(data, dict):
        raise invalid_type("body", "an object", data)
    for key in data:
        if key not in BODY_KEYS:
            raise ApiError(f"{key}: Extra inputs are not permitted", param=key, code="unknown_parameter")
    requests = data.get("requests")
    if requests is None:
        raise missing_parameter("requests")
    if not isinstance(requests, list):
        raise invalid_type("requests", "an array of requests", requests)
    if not requests:
        raise ApiError("requests: List should have at least 1 item", param="requests", code="empty_file")
    if len(requests) > MAX_REQUESTS:
        raise ApiError(
            f"requests: a Message Batch holds at most {MAX_REQUESTS:,} requests, but this one has "
            f"{len(requests):,}. Split it into several batches.",
            param="requests",
            code="too_many_requests",
        )
    seen = {}
    return [_line(index, item, seen) for index, item in enumerate(requests)]


def parse_extension(data):
    """OpenRelay's extension, `{"openrelay": {"completion_window": "1h", "admission": "strict"}}` ->
    (the window's name or None: Anthropic's fixed 24 h, batches.windows.default; the admission)."""
    extension = data.get("openrelay")
    if extension is None:
        return None, "warn"
    if not isinstance(extension, dict):
        raise invalid_type("openrelay", "an object", extension)
    for key in extension:
        if key not in OPENRELAY_KEYS:
            raise ApiError(
                f"openrelay.{key}: Extra inputs are not permitted", param=f"openrelay.{key}", code="unknown_parameter"
            )
    value, admission = extension.get("completion_window"), extension.get("admission", "warn")
    if admission not in ADMISSIONS:
        raise invalid_choice("openrelay.admission", admission, ADMISSIONS)
    return None if value is None else windows.parse(value, "openrelay.completion_window").name, admission


def _line(index, item, seen):
    where = f"requests.{index}"
    if not isinstance(item, dict):
        raise invalid_type(where, "an object with 'custom_id' and 'params'", item)
    for key in item:
        if key not in REQUEST_KEYS:
            raise ApiError(
                f"{where}.{key}: Extra inputs are not permitted", param=f"{where}.{key}", code="unknown_parameter"
            )
    custom_id, params = item.get("custom_id"), item.get("params")
    _check_custom_id(custom_id, f"{where}.custom_id")
    if params is None:
        raise missing_parameter(f"{where}.params")
    if not isinstance(params, dict):
        raise invalid_type(f"{where}.params", "an object", params)
    first = seen.setdefault(custom_id, index)
    if first != index:
        raise ApiError(
            f"{where}.custom_id: {shown(custom_id)} is already used by requests.{first}; custom_id must be "
            "unique within a batch.",
            param=f"{where}.custom_id",
            code="duplicate_custom_id",
        )
    return {"custom_id": custom_id, "method": "POST", "url": MESSAGES, "body": params}


def _check_custom_id(custom_id, param):
    if custom_id is None:
        raise missing_parameter(param)
    # NUL: custom_id is a database column, and PostgreSQL text can't hold one.
    if not isinstance(custom_id, str) or not 1 <= len(custom_id) <= MAX_CUSTOM_ID or "\x00" in custom_id:
        raise ApiError(
            f"{param}: expected a string of 1 to {MAX_CUSTOM_ID} characters (no NUL), but got {shown(custom_id)}.",
            param=param,
            code="invalid_custom_id",
        )


def check_params(lines, catalog):
    """Each request's params in Anthropic's shapes (batches.validation.messages), before anything is stored:
    ApiError (400) naming the first bad request's index, custom_id and field. `catalog`: a messages.Catalog."""
    for index, line in enumerate(lines):
        try:
            messages.check(line["body"], catalog)
        except messages.ParamInvalid as problem:
            param = f"requests.{index}.params.{problem.field}"
            raise ApiError(
                f"{param} (custom_id {shown(line['custom_id'])}): {problem.message}", param=param, code=problem.code
            ) from None
