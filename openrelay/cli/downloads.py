"""Downloads: a GET's body streamed to a file or stdout in chunks, never held in memory.

A file is written under a `.part` name and renamed when complete, so a dropped connection never
leaves a truncated file under the final name. Used by `files content get`, `batches results` and
the `--download` of a wait.
"""

from __future__ import annotations

import sys
from pathlib import Path

from openrelay.cli.client import EXIT_USAGE, CliError, _segment

DOWNLOAD_CHUNK = 1024 * 1024


def download(client, file_id, path):
    """Stream a file's content to `path` ("-" for stdout); return the bytes written."""
    return download_route(client, f"files/{_segment(file_id)}/content", path)


def download_route(client, route, path):
    """Stream a GET's body to `path` ("-" for stdout); return the bytes written."""
    if str(path) == "-":
        with client.stream(route) as response:
            return _copy(response, sys.stdout.buffer)
    path = Path(path)
    if path.is_dir() or not path.parent.is_dir():
        raise CliError(
            f"Cannot write {path}: it is a directory, or its directory does not exist.", exit_code=EXIT_USAGE
        )
    partial = path.with_name(path.name + ".part")
    # A dropped connection must not leave a truncated file under the final name.
    try:
        with client.stream(route) as response, partial.open("wb") as sink:
            written = _copy(response, sink)
        partial.replace(path)
    except OSError as exc:
        raise CliError(f"Cannot write {path}: {exc.strerror or exc}") from None
    finally:
        partial.unlink(missing_ok=True)
    return written


def _copy(response, sink):
    written = 0
    for chunk in response.iter_bytes(DOWNLOAD_CHUNK):
        sink.write(chunk)
        written += len(chunk)
    sink.flush()
    return written


def download_results(client, batch, directory):
    """Both result files of a finished batch into `directory`; [(kind, file id, path)]."""
    directory.mkdir(parents=True, exist_ok=True)
    saved = []
    for kind in ("output", "error"):
        file_id = batch.get(f"{kind}_file_id")
        if file_id:
            path = directory / f"{batch['id']}_{kind}.jsonl"
            download(client, file_id, path)
            saved.append((kind, file_id, path))
    return saved
