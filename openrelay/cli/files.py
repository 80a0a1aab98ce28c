"""`orl files`: create (upload), list, get, delete, and `content get` (download).

The commands register on `files_app` (and its `content_app`), which app.py adds to the root as
`files`. `_upload` is also how `orl batches create` uploads its input.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from openrelay.cli.client import _segment
from openrelay.cli.downloads import download
from openrelay.cli.output import emit, emit_page, report_saved, show_deleted, show_file, show_file_list

files_app = typer.Typer(no_args_is_help=True, help="Upload, list, inspect, delete and download files.")
content_app = typer.Typer(no_args_is_help=True, help="A file's bytes.")
files_app.add_typer(content_app, name="content")


def _upload(client, path):
    with path.open("rb") as handle:  # httpx streams the handle; the file is never read whole
        return client.call(
            "POST", "files", data={"purpose": "batch"}, files={"file": (path.name, handle, "application/jsonl")}
        )


@files_app.command("create")
def files_create(
    ctx: typer.Context,
    path: Annotated[Path, typer.Argument(metavar="FILE", exists=True, dir_okay=False, readable=True)],
):
    """Upload a JSONL file with purpose batch."""
    state = ctx.obj
    emit(state, _upload(state.client(), path), show_file)


@files_app.command("list")
def files_list(
    ctx: typer.Context,
    purpose: Annotated[str | None, typer.Option("--purpose", help="batch or batch_output")] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1)] = None,
    after: Annotated[str | None, typer.Option("--after", help="Start after this file id.")] = None,
):
    """List files, newest first."""
    state = ctx.obj
    params = {k: v for k, v in (("purpose", purpose), ("limit", limit), ("after", after)) if v is not None}
    page = state.client().call("GET", "files", params=params)
    emit_page(state, page, show_file_list)


@files_app.command("get")
def files_get(ctx: typer.Context, file_id: Annotated[str, typer.Argument(metavar="ID")]):
    """Show one file."""
    state = ctx.obj
    emit(state, state.client().call("GET", f"files/{_segment(file_id)}"), show_file)


@files_app.command("delete")
def files_delete(ctx: typer.Context, file_id: Annotated[str, typer.Argument(metavar="ID")]):
    """Delete a file."""
    state = ctx.obj
    deleted = state.client().call("DELETE", f"files/{_segment(file_id)}")
    emit(state, deleted, show_deleted)


@content_app.command("get")
def files_content_get(
    ctx: typer.Context,
    file_id: Annotated[str, typer.Argument(metavar="ID")],
    output: Annotated[str, typer.Option("--output", "-o", help="Where to write; - for stdout.")],
):
    """Download a file's content, streamed to disk."""
    state = ctx.obj
    written = download(state.client(), file_id, output)
    report_saved(state, output, written, {"id": file_id}, file_id)
