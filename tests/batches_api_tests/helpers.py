"""Builders shared by the Batches API tests."""

import orjson

from files import services as files

GEMMA = "openrelay/gemma-4-31b"
QWEN = "openrelay/qwen-3-8b"
CHAT = "/v1/chat/completions"


def chat_line(custom_id, model=GEMMA, **body):
    """One input record as a dict (a chat completion for `model`)."""
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": CHAT,
        "body": {"model": model, "messages": [{"role": "user", "content": f"hi {custom_id}"}], **body},
    }


def jsonl(*records):
    """JSONL bytes: dicts are dumped, bytes/str are written as they are (for broken lines)."""
    out = []
    for record in records:
        if isinstance(record, dict):
            out.append(orjson.dumps(record))
        else:
            out.append(record.encode() if isinstance(record, str) else record)
    return b"\n".join(out) + b"\n"


def upload(persona, content, purpose="batch", **kwargs):
    """Store `content` (bytes) as a File of the persona's organization."""
    return files.create_file_from_chunks(
        organization=persona.org,
        filename="input.jsonl",
        purpose=purpose,
        chunks=[content],
        expires_at=kwargs.get("expires_at", files.default_expiry(purpose)),
    )


def create(persona, **params):
    """POST /v1/batches with sensible defaults; returns the response."""
    body = {"endpoint": CHAT, "completion_window": "24h", **params}
    return persona.client.post("/v1/batches", body, format="json")


def error_of(response, status=400):
    assert response.status_code == status, response.content
    return response.json()["error"]
