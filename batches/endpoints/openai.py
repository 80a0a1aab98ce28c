"""OpenAI's Batch API: its dialect and the five endpoints its batches call."""

from types import MappingProxyType

from batches.endpoints.base import Dialect, Endpoint
from openrelay.lib import request_schemas

OPENAI = Dialect("openai")

CHAT = Endpoint(
    "/v1/chat/completions",
    "Chat Completions",
    OPENAI,
    "messages",
    "Messages parameter is required.",
    cap_keys=("max_completion_tokens", "max_tokens"),
    answers="chat",
    tool_loop="chat",
    workflows=True,
    quote="chat",
    tokenizer="chat",
    schema=request_schemas.CHAT,
)
COMPLETIONS = Endpoint(
    "/v1/completions",
    "Completions",
    OPENAI,
    "prompt",
    "Prompt parameter is required.",
    cap_keys=("max_tokens",),
    tokenizer="text",
    schema=request_schemas.COMPLETIONS,
)
EMBEDDINGS = Endpoint(
    "/v1/embeddings",
    "Embeddings",
    OPENAI,
    "input",
    "Input parameter is required.",
    answers_tokens=False,
    samples=False,
    tokenizer="text",
    schema=request_schemas.EMBEDDINGS,
)
RESPONSES = Endpoint(
    "/v1/responses",
    "Responses",
    OPENAI,
    "input",
    "Input parameter is required.",
    cap_keys=("max_output_tokens",),
    answers="responses",
    quote="responses",
    unsupported=MappingProxyType(
        {
            "background": "every batch request already runs in the background; leave 'background' out",
            "previous_response_id": "a batch request can't continue a stored response; send the whole conversation "
            "in 'input'",
            "conversation": "a batch request can't read or extend a stored conversation; send the whole conversation "
            "in 'input'",
        }
    ),
    schema=request_schemas.RESPONSES,
)
MODERATIONS = Endpoint(
    "/v1/moderations",
    "Moderations",
    OPENAI,
    "input",
    "Input parameter is required.",
    answers_tokens=False,
    samples=False,
    schema=request_schemas.MODERATIONS,
)
