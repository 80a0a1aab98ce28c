"""What an endpoint and an API family are, as data the rest of the code asks: `Endpoint` and `Dialect`.

A leaf: it imports nothing of the project but openrelay.lib (the published request schemas), so
validation, the quote, the engine and (through openrelay.web.dialects) the web layer can all read it.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from openrelay.lib.request_schemas import Problem, RequestSchema

# How a quote reads a record's input text (batches.estimate.records): a chat conversation, a Responses
# input with its instructions, one prompt or input string (or list) under `input_key`, or nothing.
QuoteShape = Literal["chat", "responses", "text", "none"]
# How a model server's tokenizer counts a record (batches.estimate.tokens): as the chat call it is
# (llama.cpp's input_tokens, vLLM's /tokenize with messages and tools), as one prompt string, or not at all.
TokenizerShape = Literal["chat", "text", "none"]
# How an output contract reads an answer's text, a re-ask adds its turns and the summed usage is written
# (batches.engine.loops.contract): a chat completion's, a Response's, or no contract at all.
AnswerShape = Literal["chat", "responses", "none"]
# Which loop answers the model's tool calls (batches.engine.loops.dispatch): the chat loop (tool_calls and
# tool messages), the Messages loop (tool_use and tool_result blocks), or none.
ToolLoop = Literal["chat", "messages", "none"]


# An error answer reshaped from the house's {"error": {...}}: (status, error object, request id) -> body.
Envelope = Callable[[int, dict[str, Any], str | None], dict[str, Any]]


@dataclass(frozen=True)
class Dialect:
    """An API family the gateway speaks: OpenAI's Batch API or Anthropic's Message Batches.

    The web layer reads the last three (openrelay.web.dialects, registered by batches.apps); OpenAI's,
    the default, leaves them unset.
    """

    name: str
    prefix: str | None = None  # the routes it owns: this path and every path under it
    envelope: Envelope | None = None  # its error answers' shape
    # Path -> the setting its JSON body may run to, past DATA_UPLOAD_MAX_MEMORY_SIZE.
    body_caps: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # What its model servers read besides the house's headers (batches.engine.calls.caller): fixed
    # headers, and the header that carries the key too (beside the Bearer token every server is sent).
    upstream_headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    key_header: str | None = None

    def upstream(self, headers: dict[str, str], api_key: str | None) -> dict[str, str]:
        """`headers` with what this dialect's servers read added; the same dict when it adds nothing."""
        if not self.upstream_headers and not self.key_header:
            return headers
        headers = {**headers, **self.upstream_headers}
        if api_key and self.key_header:
            headers[self.key_header] = api_key
        return headers


@dataclass(frozen=True)
class Endpoint:
    """One endpoint a batch's records may call, and what each part of the gateway needs to know of it."""

    path: str
    label: str  # the API's name, as OpenAI's messages spell it ("Chat Completions")
    dialect: Dialect
    input_key: str  # the body key that carries the input: a record without it is rejected
    input_missing: str  # the message of that rejection, in the dialect's wording
    cap_keys: tuple[str, ...] = ()  # the body keys that bound a record's output tokens, first found wins
    required_cap: str | None = None  # the body key every record must set to an integer of at least 1
    answers_tokens: bool = True  # False: the answer carries no output tokens (embeddings, moderations)
    # False: its answer is a function of the request alone (embeddings, moderations); True: the model
    # samples it, so only a request that pins its sampling gets the same answer twice (`deterministic`).
    samples: bool = True
    answers: AnswerShape = "none"
    tool_loop: ToolLoop = "none"
    workflows: bool = False  # `openrelay.workflow` extends its conversation
    quote: QuoteShape = "text"
    tokenizer: TokenizerShape = "none"
    # Body key -> why it cannot work in a batch. A key set to null (or false) is fine.
    unsupported: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # The request type its provider publishes in its SDK: every record's body is checked against it at create.
    schema: RequestSchema | None = None

    def body_problem(self, body: dict[str, Any]) -> Problem | None:
        """The first field of a record's body the endpoint's server would refuse (its param under "body."),
        or None. Fields the schema does not name pass: local servers read their own (vLLM's top_k, ...)."""
        return self.schema.problem(body, "body.") if self.schema is not None else None

    def deterministic(self, body: dict[str, Any]) -> bool:
        """Does the same body get the same answer (batches.reuse merges only these by default)? Always
        for an endpoint that doesn't sample; for one that does, `temperature` 0 or a `seed`, and one
        answer (`n` left out or 1). Temperature left out samples (every API's default is 1)."""
        if not self.samples:
            return True
        n = body.get("n")
        if n is not None and n != 1:
            return False
        temperature = body.get("temperature")
        pinned = isinstance(temperature, int | float) and not isinstance(temperature, bool) and temperature == 0
        return pinned or body.get("seed") is not None

    @property
    def contracts(self) -> bool:
        """Its answer is text a contract reads, its conversation one a re-ask extends."""
        return self.answers != "none"

    @property
    def tools(self) -> bool:
        """`openrelay.tool_config` runs a tool loop on it."""
        return self.tool_loop != "none"
