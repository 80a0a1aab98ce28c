"""One record's checks: `RecordChecker` checks an input record (required
keys, custom_id, method and URL, the endpoint's body, streaming, model, the
`openrelay` extensions, the body against the endpoint's published request
schema, a duplicate custom_id) and raises `RecordRejected` with
its param and OpenAI's message; it remembers the batch's model and the
custom_ids taken, so records are checked in order, once each.
"""

from batches import endpoints
from batches.validation import contracts
from batches.validation.extensions import (
    OPENRELAY_KEYS,
    TOOL_CONFIG_PARAM,
    WORKFLOW_PARAM,
    RecordRejected,
    normalize_tool_config,
    normalize_workflow,
    wrong_type,
)
from openrelay.api.params import missing_parameter
from openrelay.lib.wording import shown

# Workflows read and extend a chat conversation: no other endpoint has one. Tool loops run on
# Anthropic Messages too (tool_use blocks answered with tool_result blocks).
TOOL_ENDPOINTS = endpoints.paths_where("tools")
WORKFLOW_ENDPOINTS = endpoints.paths_where("workflows")
MAX_CUSTOM_ID = 512

NOT_AN_OBJECT = "This line is valid JSON but not a JSON object; each line must be one request object."


class RecordChecker:
    """Checks records one at a time, remembering the batch's model and the custom_ids taken.

    Checks run in a fixed order so a line with several problems always gets
    the same answer: JSON -> required params -> custom_id -> method/url ->
    body shape -> stream -> model -> openrelay extensions -> the endpoint's
    published schema -> duplicate custom_id. Only accepted records claim their custom_id and, for the
    first one, the batch's model.
    """

    def __init__(self, endpoint, *, models, workflows_enabled, output_contract=None):
        self.endpoint = endpoint
        self.spec = endpoints.get(endpoint)
        # The batch's contract from create (contracts.normalize_output_contract), False or None.
        self.output_contract = output_contract
        self.models = models  # enabled catalog names -> Model pk
        self.workflows_enabled = workflows_enabled
        self.model_name = None
        self.seen = {}  # custom_id -> line of the accepted record that took it

    @property
    def model_pk(self):
        return self.models.get(self.model_name)

    def check(self, obj, line):
        """Return the record's custom_id, or raise RecordRejected."""
        if not isinstance(obj, dict):
            raise RecordRejected("invalid_json_line", NOT_AN_OBJECT)
        for key in ("custom_id", "method", "url", "body"):
            if obj.get(key) is None:
                raise RecordRejected("missing_required_parameter", missing_parameter(key).message, key)
        custom_id, body = obj["custom_id"], obj["body"]
        _check_custom_id(custom_id)
        self._check_target(obj["method"], obj["url"])
        self._check_body_shape(body)
        self._check_stream(body)
        self._check_supported(body)
        if self.spec.required_cap is not None:
            _check_required_cap(body, self.spec.required_cap)
        model = self._check_model(body["model"])
        self._check_extensions(body)
        self._check_schema(body)
        self._claim(custom_id, model, line)
        return custom_id

    def _check_target(self, method, url):
        if method != "POST":
            raise RecordRejected(
                "invalid_request", f"Invalid value for 'method': {shown(method)}. Only 'POST' is supported.", "method"
            )
        if url != self.endpoint:
            raise RecordRejected(
                "invalid_url", "The URL provided for this request does not match the batch endpoint.", "url"
            )

    def _check_body_shape(self, body):
        if not isinstance(body, dict):
            raise wrong_type("invalid_request", "body", "an object", body)
        model = body.get("model")
        if model is None or model == "":
            raise RecordRejected("invalid_request", "Model parameter is required.", "body.model")
        if not isinstance(model, str):
            raise wrong_type("invalid_request", "body.model", "a string", model)
        key, message = self.spec.input_key, self.spec.input_missing
        value = body.get(key)
        accepted = (list,) if key == "messages" else (list, str)
        if not isinstance(value, accepted) or not value:
            raise RecordRejected("invalid_request", message, f"body.{key}")

    def _check_stream(self, body):
        if body.get("stream") not in (None, False):
            name = self.spec.label
            raise RecordRejected(
                "streaming_unsupported", f"{name}: Streaming is not supported in the Batch API.", "body.stream"
            )

    def _check_supported(self, body):
        for key, why in self.spec.unsupported.items():
            if body.get(key) not in (None, False):
                name = self.spec.label
                raise RecordRejected(
                    "unsupported_parameter", f"{name}: '{key}' is not supported in the Batch API: {why}.", f"body.{key}"
                )

    def _check_schema(self, body):
        """The body against its endpoint's published request type (batches.endpoints): what a real server
        refuses with a 400 is refused here, with its line, instead of costing a call."""
        problem = self.spec.body_problem(body)
        if problem is not None:
            raise RecordRejected(problem.code, problem.message, problem.param)

    def _check_model(self, model):
        if model not in self.models:
            raise RecordRejected(
                "model_not_found", f"The provided model '{model}' is not supported by the Batch API.", "body.model"
            )
        if self.model_name is not None and model != self.model_name:
            raise RecordRejected(
                "model_mismatch",
                f"The provided model '{model}' does not match this batch's model "
                f"'{self.model_name}'; a batch runs a single model.",
                "body.model",
            )
        return model

    def _check_extensions(self, body):
        if "tool_config" in body:
            raise RecordRejected(
                "tool_config_moved",
                "'tool_config' is no longer accepted at the top of the body; move it to 'openrelay.tool_config'.",
                "body.tool_config",
            )
        extensions = body.get("openrelay")
        if extensions is None:
            self._check_contract(body, {})
            return
        if not isinstance(extensions, dict):
            raise wrong_type("invalid_request", "body.openrelay", "an object", extensions)
        for key in extensions:
            if key not in OPENRELAY_KEYS:
                raise RecordRejected(
                    "invalid_request", f"Unknown parameter 'body.openrelay.{key}'.", f"body.openrelay.{key}"
                )
        self._check_tool_or_workflow(extensions)
        self._check_contract(body, extensions)

    def _check_contract(self, body, extensions):
        if "workflow" in extensions:
            if "output_contract" in extensions:
                raise RecordRejected(
                    contracts.CODE,
                    "A workflow record's contracts go on its requests: each request body's response_format "
                    "or openrelay.output_contract.",
                    contracts.PARAM,
                )
            contracts.contract_for(body, self.endpoint)  # its root request's response_format
            return
        contracts.contract_for(body, self.endpoint, self.output_contract)

    def _check_tool_or_workflow(self, extensions):
        if "tool_config" in extensions and "workflow" in extensions:
            raise RecordRejected(
                "invalid_workflow",
                "A record can carry 'openrelay.workflow' or 'openrelay.tool_config', not both.",
                "body.openrelay",
            )
        if "tool_config" in extensions:
            if self.endpoint not in TOOL_ENDPOINTS:
                raise RecordRejected(
                    "invalid_tool_config",
                    f"'openrelay.tool_config' is only supported on {' and '.join(TOOL_ENDPOINTS)}.",
                    TOOL_CONFIG_PARAM,
                )
            normalize_tool_config(extensions["tool_config"])
        if "workflow" in extensions:
            if self.endpoint not in WORKFLOW_ENDPOINTS:
                raise RecordRejected(
                    "invalid_workflow",
                    f"'openrelay.workflow' is only supported on {' and '.join(WORKFLOW_ENDPOINTS)}.",
                    WORKFLOW_PARAM,
                )
            if not self.workflows_enabled:
                raise RecordRejected(
                    "workflow_not_enabled", "Workflows are not enabled for this organization.", WORKFLOW_PARAM
                )
            normalize_workflow(extensions["workflow"])

    def _claim(self, custom_id, model, line):
        first = self.seen.get(custom_id)
        if first is not None:
            raise RecordRejected(
                "duplicate_custom_id",
                f"The custom_id '{custom_id}' is already used by the request "
                f"on line {first}; custom_id must be unique.",
                "custom_id",
            )
        self.seen[custom_id] = line
        if self.model_name is None:
            self.model_name = model


def _check_required_cap(body, key):
    """A Messages request must say how many tokens it may generate (`max_tokens`): an integer of at
    least 1 (0, Anthropic's cache pre-warming, runs nothing worth a batch). In Anthropic's wording,
    the one dialect whose endpoint requires a cap."""
    value = body.get(key)
    if value is None:
        raise RecordRejected("missing_required_parameter", f"{key}: Field required", f"body.{key}")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RecordRejected(
            "invalid_request",
            f"{key}: expected an integer of at least 1, but got {shown(value)} instead.",
            f"body.{key}",
        )


def _check_custom_id(custom_id):
    # NUL: custom_id is a database column, and PostgreSQL text can't hold one.
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > MAX_CUSTOM_ID or "\x00" in custom_id:
        raise RecordRejected(
            "invalid_request",
            f"Invalid 'custom_id': expected a non-empty string of at most {MAX_CUSTOM_ID} characters (no NUL).",
            "custom_id",
        )
