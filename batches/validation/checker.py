"""A checker process: answers checked against their contract's schema, one at a time, for the
engine that started it (batches.engine.checks), so a costly check holds this process and not
the engine's event loop. `python -m batches.validation.checker MEMORY_BYTES`.

Each request on stdin is a header (two big-endian u32: the schema's bytes, the answer's bytes;
a schema of 0 bytes is a json_object contract), the schema's canonical text, the answer's text.
Each reply on stdout is a u32 length and a JSON object: {"errors": [...]} or {"not_json": why}.

The process caps its own address space (RLIMIT_AS): a check that would take more dies here, and
its engine fails that record (measured: 558 MB of errors for one answer against the 16-level
anyOf chain). No Django: it starts in ~0.2 s.
"""

import resource
import struct
import sys

import orjson

from batches.validation.validators import compiled, errors_of, object_errors

HEADER = struct.Struct(">II")
LENGTH = struct.Struct(">I")


def answer(schema_text, text):
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        return {"not_json": str(exc)}
    if not schema_text:
        return {"errors": object_errors(value)}
    return {"errors": errors_of(compiled(schema_text), value)}


def serve(stdin, stdout):
    while header := stdin.read(HEADER.size):
        schema_len, text_len = HEADER.unpack(header)
        schema_text, text = stdin.read(schema_len), stdin.read(text_len)
        reply = orjson.dumps(answer(schema_text, text))
        stdout.write(LENGTH.pack(len(reply)) + reply)
        stdout.flush()


if __name__ == "__main__":
    limit = int(sys.argv[1])
    if limit:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    serve(sys.stdin.buffer, sys.stdout.buffer)
