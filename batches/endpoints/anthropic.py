"""Anthropic's Message Batches: its dialect and its one endpoint, the Messages API.

The only home of the path: the routes (batches.message_batches), the checks
(batches.validation.messages), the engine's translation (batches.engine.calls.messages) and
the web layer (its error envelope, host and body cap: openrelay.web.dialects) ask for it here.
"""

from types import MappingProxyType

from batches.endpoints.base import Dialect, Endpoint
from openrelay.api.errors import anthropic_envelope
from openrelay.lib import request_schemas

PATH = "/v1/messages"

ANTHROPIC = Dialect(
    "anthropic",
    prefix=PATH,
    envelope=anthropic_envelope,
    # A Message Batch create carries every request in its JSON body (batches.message_batches).
    body_caps=MappingProxyType({f"{PATH}/batches": "OPENRELAY_MAX_MESSAGE_BATCH_BYTES"}),
    # What Anthropic-format servers read: the version, and the key as x-api-key too.
    upstream_headers=MappingProxyType({"anthropic-version": "2023-06-01"}),
    key_header="x-api-key",
)

MESSAGES = Endpoint(
    PATH,
    "Messages",
    ANTHROPIC,
    "messages",
    "messages: Field required",
    required_cap="max_tokens",
    tool_loop="messages",
    # A quote reads no input text of a Messages record (it did not before the registry either): its local
    # count is the approximation's floor, and no model server tokenizer is asked.
    quote="none",
    schema=request_schemas.MESSAGES,
)
