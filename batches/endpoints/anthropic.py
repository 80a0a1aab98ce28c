"""Anthropic's Message Batches: its dialect and its one endpoint, the Messages API.

The only home of the path: the routes (batches.message_batches), the checks
(batches.validation.messages) and the engine's translation (batches.engine.calls.messages)
ask for it here.
"""

from batches.endpoints.base import Dialect, Endpoint

ANTHROPIC = Dialect("anthropic")

MESSAGES = Endpoint(
    "/v1/messages",
    "Messages",
    ANTHROPIC,
    "messages",
    "messages: Field required",
    tool_loop="messages",
    # A quote reads no input text of a Messages record (it did not before the registry either): its local
    # count is the approximation's floor, and no model server tokenizer is asked.
    quote="none",
)
