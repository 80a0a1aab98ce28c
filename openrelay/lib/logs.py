"""OPENRELAY_LOG_FORMAT=json: one JSON object a line, with the batch and record a line is about.

Fields: `time` (UTC, ISO 8601), `level`, `logger`, `message`, `process`, and
`batch_id` / `record_id` (the API's `batch_...` and `batch_req_...` ids)
when the line was written while an engine worked a record (the engine binds
them with `working_on`, a context variable, so every line of that record's
coroutine carries them without passing them down), `exc` for a traceback.

Never a secret: the message and traceback go through openrelay.lib.redaction
with this process's own secrets (SECRET_KEY, the metrics token, the
database's and Redis' passwords), and credentials in the shapes we know
(`Bearer ...`, our `or_` keys, `sk-` keys, a URL's password) are masked
whatever they belong to. Peers' text was redacted with their own secrets
before it reached a message (the engine, tool executors, MCP, webhooks).
"""

import contextvars
import hashlib
import logging
import os
import re
from datetime import UTC, datetime
from urllib.parse import urlsplit

import orjson

from openrelay.lib.env import DEV_SECRET_KEY
from openrelay.lib.redaction import REDACTED, redact

_working_on = contextvars.ContextVar("openrelay_working_on", default=None)

_CREDENTIALS = re.compile(
    r"(?i)(bearer\s+)[^\s\"',;]+"  # Authorization values
    r"|\bor_[A-Za-z0-9_-]{16,}"  # our API keys
    r"|\bsk-[A-Za-z0-9_-]{8,}"  # OpenAI-style keys
    r"|(?<=://)[^/\s:@]*:[^/\s@]+(?=@)"  # user:password@ in a URL
)


def working_on(batch_public_id, batch_pk, line):
    """Bind the record an engine works to this coroutine's log lines; returns a token for `done`."""
    return _working_on.set((batch_public_id, batch_pk, line))


def done(token):
    _working_on.reset(token)


def _record_id(batch_pk, line):
    # As batches.models.Record.public_id derives it (no model import: logging loads first).
    return "batch_req_" + hashlib.sha256(f"{batch_pk}:{line}".encode()).hexdigest()[:32]


def _own_secrets():
    from django.conf import settings

    key = getattr(settings, "SECRET_KEY", "")
    # The development default is printed in this repository, so it guards nothing; as a secret its
    # pieces ("openrela", "developm") would cut every model name and path out of the lines.
    values = [key if key != DEV_SECRET_KEY else "", getattr(settings, "OPENRELAY_METRICS_TOKEN", "")]
    for url in (os.environ.get("DATABASE_URL", ""), os.environ.get("REDIS_URL", "")):
        try:
            values.append(urlsplit(url).password or "")
        except ValueError:
            pass
    return tuple(value for value in values if value)


def scrub(text, secrets):
    text = redact(text, secrets)
    return _CREDENTIALS.sub(lambda m: (m.group(1) or "") + REDACTED, text)


class JsonFormatter(logging.Formatter):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._secrets = None

    def format(self, record):
        if self._secrets is None:
            self._secrets = _own_secrets()
        line = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": scrub(record.getMessage(), self._secrets),
            "process": record.process,
        }
        bound = _working_on.get()
        if bound is not None:
            line["batch_id"], line["record_id"] = bound[0], _record_id(bound[1], bound[2])
        if record.exc_info:
            line["exc"] = scrub(self.formatException(record.exc_info), self._secrets)
        return orjson.dumps(line).decode()
