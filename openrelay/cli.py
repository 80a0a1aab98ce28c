"""`orl`: the OpenRelay Batch command-line client.

It speaks only the public HTTP API (httpx), never Django: it must run on a
machine with just this package installed and no settings. Tables go to
stdout, errors and progress to stderr, so `--json` output and `-o -`
downloads stay clean for pipes.

Exit codes: 0 success, 1 API error or unreachable server, 2 usage error
(bad option, no API key, missing input file), 3 a waited-for batch ended
failed, expired or cancelled.
"""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Annotated
from urllib.parse import quote

import httpx
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn
from rich.table import Table
from rich.text import Text
from typer.core import TyperGroup

from openrelay.api.lists import list_object

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
EXIT_API_ERROR, EXIT_USAGE, EXIT_BATCH_UNSUCCESSFUL = 1, 2, 3
TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
UNSUCCESSFUL = frozenset({"failed", "expired", "cancelled"})
# Uploads of 200 MB and creates that scan 50,000 records take a while; a
# dead host should still fail fast.
TIMEOUT = httpx.Timeout(120.0, connect=10.0)
DOWNLOAD_CHUNK = 1024 * 1024
REJECTIONS_SHOWN = 20
# A wait can last hours: a server restart or proxy hiccup mid-wait should
# not end it, so polling tolerates a few consecutive transient failures.
POLL_RETRIES = 5
PLAIN_WIDTH = 200  # tables in pipes and logs: wide enough that ids never wrap


class Priority(StrEnum):
    standard = "standard"
    expedited = "expedited"


# ---------------------------------------------------------------------------
# Errors


class CliError(Exception):
    """Ends the command: the message goes to stderr and the process exits with `exit_code`."""

    def __init__(self, message, exit_code=EXIT_API_ERROR, details=()):
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.details = tuple(details)
        self.transient = False


class ApiFailure(CliError):
    """A non-2xx answer, shown from the API's error envelope."""

    def __init__(self, method, url, status, error):
        self.status = status
        self.error = error
        details = [
            f"HTTP {status}  type: {error.get('type') or '-'}  code: {error.get('code') or '-'}  "
            f"param: {error.get('param') or '-'}",
            f"{method} {url}",
        ]
        super().__init__(error.get("message") or f"HTTP {status}", details=details)
        self.transient = status == 429 or status >= 500

    @classmethod
    def from_response(cls, response):
        try:
            error = response.json()["error"]
            if not isinstance(error, dict):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            # Not our envelope: a proxy's error page, or a base URL that points elsewhere.
            error = {"message": f"HTTP {response.status_code} without an API error body; is the base URL right "
                                f"(it ends in /v1)? The answer began: {response.text[:120]!r}"}
        return cls(response.request.method, response.request.url, response.status_code, error)


class Unreachable(CliError):
    def __init__(self, method, url, exc):
        reason = str(exc) or type(exc).__name__
        super().__init__(f"Could not reach {url} ({method}): {reason}")
        self.transient = True


# ---------------------------------------------------------------------------
# HTTP


class Client:
    """The API over one httpx connection pool; raises CliError subclasses, never httpx errors."""

    def __init__(self, base_url, api_key):
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.base_url + "/",
            headers={"Authorization": f"Bearer {api_key}", "User-Agent": f"orl/{_version()}"},
            timeout=TIMEOUT,
        )

    def close(self):
        self._http.close()

    def call(self, method, path, **kwargs):
        """One request; the decoded JSON body of a 2xx answer."""
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise Unreachable(method, self._url(path), exc) from None
        if response.is_error:
            raise ApiFailure.from_response(response)
        try:
            return response.json()
        except ValueError:
            raise ApiFailure(method, response.request.url, response.status_code,
                             {"message": "The server answered with something that is not JSON; is the base URL "
                                         "right (it ends in /v1)?"}) from None

    @contextmanager
    def stream(self, path):
        """A GET whose body is read in chunks by the caller (downloads are never held in memory)."""
        try:
            with self._http.stream("GET", path) as response:
                if response.is_error:
                    response.read()  # an error body is a small JSON envelope
                    raise ApiFailure.from_response(response)
                yield response
        except httpx.TransportError as exc:
            raise Unreachable("GET", self._url(path), exc) from None

    def _url(self, path):
        return f"{self.base_url}/{path}"


def _version():
    try:
        return importlib_metadata.version("openrelay-batch")
    except importlib_metadata.PackageNotFoundError:
        return "dev"


def _segment(value):
    # An id is one path segment: "../x" must not walk to another route.
    return quote(value, safe="")


# ---------------------------------------------------------------------------
# Global state and error reporting


@dataclass
class State:
    api_key: str | None
    base_url: str
    json: bool
    out: Console = field(default_factory=lambda: _console(sys.stdout))
    err: Console = field(default_factory=lambda: _console(sys.stderr))
    _client: Client | None = None

    def client(self):
        if not self.api_key:
            raise CliError("No API key: set OPENRELAY_API_KEY or pass --api-key.", exit_code=EXIT_USAGE)
        if self._client is None:
            self._client = Client(self.base_url, self.api_key)
        return self._client

    def close(self):
        if self._client is not None:
            self._client.close()

    def redact(self, text):
        """The key must never be printed, even if a server or proxy echoes it back."""
        text = str(text)
        return text.replace(self.api_key, "***") if self.api_key else text


def _console(stream):
    return Console(file=stream, width=None if stream.isatty() else PLAIN_WIDTH)


def _report(state, error):
    state.err.print(Text(state.redact(f"Error: {error.message}"), style="bold red"))
    for line in error.details:
        state.err.print(Text(state.redact(f"  {line}")))


# The root's options, which may also follow the command (`orl batches get ID --json`), as gh,
# kubectl and aws allow: they are moved in front of it before parsing.
_GLOBAL_FLAGS = ("--json",)
_GLOBAL_WITH_VALUE = ("--api-key", "--base-url")


def global_options_first(args):
    """`args` with every global option (and its value) moved to the front; nothing after `--` moves."""
    front, rest = [], []
    tokens = iter(args)
    for token in tokens:
        if token == "--":
            rest += [token, *tokens]
        elif token in _GLOBAL_FLAGS or token.partition("=")[0] in _GLOBAL_WITH_VALUE and "=" in token:
            front.append(token)
        elif token in _GLOBAL_WITH_VALUE:
            value = next(tokens, None)
            if value is None:
                raise typer.BadParameter("it needs a value.", param_hint=f"'{token}'")
            front += [token, value]
        else:
            rest.append(token)
    return front + rest


class _Group(TyperGroup):
    """The root group: global options anywhere; CliError from any command becomes stderr text and an exit code."""

    def parse_args(self, ctx, args):
        return super().parse_args(ctx, global_options_first(args))

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except CliError as error:
            _report(ctx.obj, error)
            raise typer.Exit(error.exit_code) from None


# Pretty tracebacks print local variables, and a local may hold the API key.
app = typer.Typer(cls=_Group, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="OpenRelay Batch: upload inputs, run batches, fetch results.")
batches_app = typer.Typer(no_args_is_help=True, help="Create, inspect, wait for and cancel batches.")
files_app = typer.Typer(no_args_is_help=True, help="Upload, list, inspect, delete and download files.")
content_app = typer.Typer(no_args_is_help=True, help="A file's bytes.")
webhooks_app = typer.Typer(no_args_is_help=True, help="Endpoints that receive batch events (signed POSTs).")
app.add_typer(batches_app, name="batches")
app.add_typer(files_app, name="files")
app.add_typer(webhooks_app, name="webhooks")
files_app.add_typer(content_app, name="content")


@app.callback()
def root(
    ctx: typer.Context,
    api_key: Annotated[str | None, typer.Option(
        "--api-key", help="API key (default: $OPENRELAY_API_KEY, which ps can't see).", show_default=False)] = None,
    base_url: Annotated[str | None, typer.Option(
        "--base-url", help=f"API base URL (default: $OPENRELAY_BASE_URL or {DEFAULT_BASE_URL}).",
        show_default=False)] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the API objects as JSON.")] = False,
):
    # The environment is read here rather than through typer's envvar=, which
    # could show the value in --help.
    ctx.obj = State(
        api_key=api_key or os.environ.get("OPENRELAY_API_KEY") or None,
        base_url=base_url or os.environ.get("OPENRELAY_BASE_URL") or DEFAULT_BASE_URL,
        json=json_output,
    )
    ctx.call_on_close(ctx.obj.close)


def main():
    app()


# ---------------------------------------------------------------------------
# Formatting


def print_json(value):
    typer.echo(json.dumps(value, indent=2, ensure_ascii=False))


def _when(timestamp):
    if timestamp is None:
        return "-"
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _cost(batch):
    # The billing fields may arrive inside `usage` (as the docs put it) or beside it.
    usage = batch.get("usage") or {}
    return usage.get("cost") or batch.get("cost")


def _cost_text(cost):
    return f"{cost['total']} {cost.get('currency', '')}".strip()


def _kv_table(rows):
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for label, value in rows:
        table.add_row(label, Text(str(value)))
    return table


def _batch_rows(batch):
    counts = batch["request_counts"]
    rows = [
        ("id", batch["id"]), ("status", batch["status"]), ("endpoint", batch["endpoint"]),
        ("model", batch.get("model") or "-"), ("priority", batch.get("priority") or "-"),
        ("input file", batch["input_file_id"]), ("output file", batch.get("output_file_id") or "-"),
        ("error file", batch.get("error_file_id") or "-"),
        ("requests", f"total {counts['total']}  completed {counts['completed']}  failed {counts['failed']}"),
    ]
    usage = batch.get("usage")
    if usage:
        rows.append(("tokens", f"input {usage['input_tokens']:,} (cached "
                               f"{usage['input_tokens_details']['cached_tokens']:,})  output "
                               f"{usage['output_tokens']:,}  total {usage['total_tokens']:,}"))
    cost = _cost(batch)
    if cost:
        rows.append(("cost", f"{_cost_text(cost)}  (input {cost['input']}, cached input {cost['cached_input']}, "
                             f"output {cost['output']})"))
    if batch.get("metadata"):
        rows.append(("metadata", ", ".join(f"{k}={v}" for k, v in batch["metadata"].items())))
    for name in ("created_at", "in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at",
                 "cancelling_at", "cancelled_at", "expires_at"):
        if batch.get(name) is not None:
            rows.append((name.removesuffix("_at").replace("_", " "), _when(batch[name])))
    return rows


def show_batch(state, batch):
    state.out.print(_kv_table(_batch_rows(batch)))
    show_rejections(state, batch)


def show_rejections(state, batch):
    """The records refused at create, with their 1-based lines and codes."""
    rejected = (batch.get("errors") or {}).get("data") or []
    if not rejected:
        return
    table = Table(title=f"{len(rejected)} rejected record(s)", title_justify="left")
    for column in ("line", "code", "param", "message"):
        table.add_column(column, overflow="fold")
    for error in rejected[:REJECTIONS_SHOWN]:
        line = error.get("line")
        table.add_row(*(Text(str(v)) for v in (
            "-" if line is None else line, error.get("code") or "-", error.get("param") or "-",
            error.get("message") or "")))
    state.out.print(table)
    if len(rejected) > REJECTIONS_SHOWN:
        state.out.print(Text(f"... and {len(rejected) - REJECTIONS_SHOWN} more: "
                             f"orl --json batches get {batch['id']}"))


def show_batch_list(state, batches, has_more):
    table = Table()
    for column in ("id", "status", "endpoint", "model", "done", "failed", "created"):
        table.add_column(column, no_wrap=column == "id")
    for batch in batches:
        counts = batch["request_counts"]
        table.add_row(*(Text(str(v)) for v in (
            batch["id"], batch["status"], batch["endpoint"], batch.get("model") or "-",
            f"{counts['completed'] + counts['failed']}/{counts['total']}", counts["failed"],
            _when(batch["created_at"]))))
    state.out.print(table)
    if has_more:
        state.out.print(Text(f"More: orl batches list --after {batches[-1]['id']} (or --all)"))


def show_file(state, file):
    state.out.print(_kv_table([
        ("id", file["id"]), ("filename", file["filename"]), ("purpose", file["purpose"]),
        ("bytes", f"{file['bytes']:,}"), ("created", _when(file["created_at"])),
        ("expires", _when(file.get("expires_at"))),
    ]))


def show_file_list(state, files, has_more):
    table = Table()
    for column in ("id", "filename", "purpose", "bytes", "created", "expires"):
        table.add_column(column, no_wrap=column == "id")
    for file in files:
        table.add_row(*(Text(str(v)) for v in (
            file["id"], file["filename"], file["purpose"], f"{file['bytes']:,}", _when(file["created_at"]),
            _when(file.get("expires_at")))))
    state.out.print(table)
    if has_more:
        state.out.print(Text(f"More: orl files list --after {files[-1]['id']}"))


def show_webhook(state, endpoint):
    rows = [("id", endpoint["id"]), ("name", endpoint["name"]), ("url", endpoint["url"]),
            ("events", ", ".join(endpoint["event_types"])), ("secret", endpoint.get("signing_secret_hint") or "-"),
            ("created", _when(endpoint["created_at"]))]
    state.out.print(_kv_table(rows))
    if endpoint.get("signing_secret"):
        # Shown by the server this once (create, rotate): the receiver needs it to check signatures.
        state.out.print(Text(f"Signing secret (shown once, keep it): {endpoint['signing_secret']}", style="bold"),
                        soft_wrap=True)  # never folded: it is copied whole


def show_webhook_list(state, endpoints, has_more):
    table = Table()
    for column in ("id", "name", "url", "events", "created"):
        table.add_column(column, no_wrap=column == "id")
    for endpoint in endpoints:
        table.add_row(*(Text(str(v)) for v in (
            endpoint["id"], endpoint["name"], endpoint["url"], ", ".join(endpoint["event_types"]),
            _when(endpoint["created_at"]))))
    state.out.print(table)
    if has_more:
        state.out.print(Text(f"More: orl webhooks list --after {endpoints[-1]['id']}"))


def emit(state, value, show):
    """--json prints the API object; otherwise `show` renders it as tables."""
    if state.json:
        print_json(value)
    else:
        show(state, value)


def emit_page(state, page, show_list):
    """A list envelope: as JSON with --json, else `show_list(state, data, has_more)`."""
    emit(state, page, lambda s, p: show_list(s, p["data"], p["has_more"]))


def show_deleted(state, deleted):
    state.out.print(Text(f"Deleted {deleted['id']}."))


def report_saved(state, output, written, record, what):
    """After a download to `output`: nothing for stdout (it carries the content), else JSON or a line."""
    if output == "-":
        return
    if state.json:
        print_json({**record, "path": str(output), "bytes": written})
    else:
        state.out.print(Text(f"Saved {written:,} bytes of {what} to {output}."))


# ---------------------------------------------------------------------------
# Waiting


class Pace:
    """Records per second over the observed wait, and the time left at that pace."""

    def __init__(self):
        self.start = None

    def observe(self, done, total):
        now = time.monotonic()
        if self.start is None:
            self.start = (now, done)
        began, done_then = self.start
        rate = (done - done_then) / (now - began) if now > began else 0.0
        left = (total - done) / rate if rate > 0 and total else None
        return rate, left


def _duration(seconds):
    if seconds is None:
        return "--:--"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def progress_detail(batch, rate, left):
    counts = batch["request_counts"]
    parts = [f"completed {counts['completed']}", f"failed {counts['failed']}"]
    if batch.get("usage"):
        parts.append(f"{batch['usage']['total_tokens']:,} tokens")
    cost = _cost(batch)
    if cost:
        parts.append(_cost_text(cost))
    parts.append(f"{rate:.1f} rec/s")
    if batch["status"] not in TERMINAL:
        parts.append(f"{_duration(left)} left")
    return "  ".join(parts)


class BatchProgress:
    """The live bar on a terminal; one plain line per change in a pipe or a CI log."""

    def __init__(self, console):
        self.console = console
        self.pace = Pace()
        self.live = console.is_interactive  # a bar needs cursor movement; logs get lines
        self.progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"), console=console, transient=False,
        ) if self.live else None
        self.task = None
        self.last_state = None

    def __enter__(self):
        if self.live:
            self.progress.start()
        return self

    def __exit__(self, *exc):
        if self.live:
            self.progress.stop()

    def update(self, batch):
        counts = batch["request_counts"]
        done, total = counts["completed"] + counts["failed"], counts["total"]
        detail = progress_detail(batch, *self.pace.observe(done, total))
        if self.live:
            self._update_bar(batch["status"], done, total or None, detail)
        elif (batch["status"], counts) != self.last_state:
            # The rate changes every poll; only a new status or count is worth a log line.
            self.last_state = (batch["status"], counts)
            self.console.print(Text(f"{batch['id']} {batch['status']} {done}/{total}  {detail}"))

    def _update_bar(self, status, done, total, detail):
        if self.task is None:
            self.task = self.progress.add_task(status, total=total, completed=done, detail=detail)
        self.progress.update(self.task, description=status, completed=done, total=total, detail=detail)


def poll_batch(client, batch_id, poll_interval):
    for attempt in range(POLL_RETRIES + 1):
        try:
            return client.call("GET", f"batches/{_segment(batch_id)}")
        except CliError as error:
            if not error.transient or attempt == POLL_RETRIES:
                raise
            time.sleep(max(poll_interval, 1.0) * (attempt + 1))


def wait_for_batch(state, batch, poll_interval):
    """Poll until the batch reaches a terminal status; return it as it ended."""
    client = state.client()
    with BatchProgress(state.err) as progress:
        while True:
            progress.update(batch)
            if batch["status"] in TERMINAL:
                return batch
            time.sleep(poll_interval)
            batch = poll_batch(client, batch["id"], poll_interval)


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
        raise CliError(f"Cannot write {path}: it is a directory, or its directory does not exist.",
                       exit_code=EXIT_USAGE)
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


def show_outcome(state, batch, saved, rejections):
    counts = batch["request_counts"]
    state.out.print(Text(f"Batch {batch['id']} {batch['status']}: {counts['completed']} completed, "
                         f"{counts['failed']} failed of {counts['total']}.", style="bold"))
    downloaded = {kind: path for kind, _, path in saved}
    for kind in ("output", "error"):
        file_id = batch.get(f"{kind}_file_id")
        if kind in downloaded:
            state.out.print(Text(f"{kind.capitalize()} file {file_id} saved to {downloaded[kind]}"))
        elif file_id:
            state.out.print(Text(f"{kind.capitalize()} file {file_id}: orl files content get {file_id} "
                                 f"-o {batch['id']}_{kind}.jsonl"))
    if not batch.get("output_file_id") and not batch.get("error_file_id"):
        state.out.print(Text("No result files."))
    if rejections:
        show_rejections(state, batch)


def finish_waiting(state, batch, poll_interval, directory, rejections=True):
    batch = wait_for_batch(state, batch, poll_interval)
    saved = download_results(state.client(), batch, directory) if directory else []
    if state.json:
        print_json(batch)
    else:
        show_outcome(state, batch, saved, rejections)
    if batch["status"] in UNSUCCESSFUL:
        raise CliError(f"Batch {batch['id']} ended {batch['status']}.", exit_code=EXIT_BATCH_UNSUCCESSFUL)


def _waiting(state, batch_id, fn):
    """Ctrl-C stops the client, not the batch: say how to pick the wait up again."""
    try:
        fn()
    except KeyboardInterrupt:
        state.err.print(Text(f"Stopped waiting; the batch keeps running. Resume: orl batches wait {batch_id}"))
        raise typer.Exit(130) from None


# ---------------------------------------------------------------------------
# batches


def _check_metadata(values):
    # Checked while parsing so a bad pair is a usage error (exit 2) before anything is uploaded.
    for item in values or ():
        if not item.partition("=")[0] or "=" not in item:
            raise typer.BadParameter(f"expected key=value, got {item!r}")
    return values


def _metadata_pairs(values):
    return dict(item.split("=", 1) for item in values or ())


PollInterval = Annotated[float, typer.Option("--poll-interval", min=0.05, help="Seconds between polls.")]
DownloadDir = Annotated[Path | None, typer.Option(
    "--download", file_okay=False, help="Save the output and error files into this directory.")]


@batches_app.command("create")
def batches_create(
    ctx: typer.Context,
    input_file: Annotated[Path, typer.Option(
        "--input-file", "-f", exists=True, dir_okay=False, readable=True, help="JSONL file of requests.")],
    endpoint: Annotated[str, typer.Option("--endpoint", "-e", help="e.g. /v1/chat/completions")],
    completion_window: Annotated[str, typer.Option("--completion-window")] = "24h",
    metadata: Annotated[list[str] | None, typer.Option(
        "--metadata", "-m", callback=_check_metadata, help="key=value; repeat for more pairs.")] = None,
    priority: Annotated[Priority | None, typer.Option("--priority")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait for the batch to finish, with a progress bar.")] = False,
    poll_interval: PollInterval = 1.0,
    download_dir: DownloadDir = None,
):
    """Upload --input-file (purpose batch), then create a batch from it."""
    state = ctx.obj
    client = state.client()
    file = _upload(client, input_file)
    batch = _create_batch(client, file["id"], endpoint, completion_window, _metadata_pairs(metadata), priority)
    if not state.json:
        state.out.print(Text(f"Uploaded {input_file.name} as {file['id']} ({file['bytes']:,} bytes)."))
        show_batch(state, batch)
    if wait or download_dir:
        # The rejections were just shown with the new batch.
        _waiting(state, batch["id"],
                 lambda: finish_waiting(state, batch, poll_interval, download_dir, rejections=False))
    elif state.json:
        print_json(batch)


def _upload(client, path):
    with path.open("rb") as handle:  # httpx streams the handle; the file is never read whole
        return client.call("POST", "files", data={"purpose": "batch"},
                           files={"file": (path.name, handle, "application/jsonl")})


def _create_batch(client, file_id, endpoint, completion_window, metadata, priority):
    body = {"input_file_id": file_id, "endpoint": endpoint, "completion_window": completion_window}
    if metadata:
        body["metadata"] = metadata
    if priority is not None:
        body["priority"] = priority.value
    try:
        return client.call("POST", "batches", json=body)
    except ApiFailure:
        # The upload existed only for this batch; don't leave it behind.
        try:
            client.call("DELETE", f"files/{_segment(file_id)}")
        except CliError:
            pass
        raise


@batches_app.command("get")
def batches_get(ctx: typer.Context, batch_id: Annotated[str, typer.Argument(metavar="ID")]):
    """Show one batch."""
    state = ctx.obj
    emit(state, state.client().call("GET", f"batches/{_segment(batch_id)}"), show_batch)


@batches_app.command("list")
def batches_list(
    ctx: typer.Context,
    limit: Annotated[int | None, typer.Option(
        "--limit", min=1, max=100, help="Page size (server default 20).")] = None,
    after: Annotated[str | None, typer.Option("--after", help="Start after this batch id.")] = None,
    all_pages: Annotated[bool, typer.Option("--all", help="Follow has_more through every page.")] = False,
):
    """List batches, newest first."""
    state = ctx.obj
    page = _list_batches(state.client(), limit, after, all_pages)
    emit_page(state, page, show_batch_list)


def _list_batches(client, limit, after, all_pages):
    """One page, or with all_pages every page merged into one list envelope."""
    data = []
    while True:
        params = {k: v for k, v in (("limit", limit), ("after", after)) if v is not None}
        page = client.call("GET", "batches", params=params)
        data += page["data"]
        if not (all_pages and page["has_more"] and page["data"]):
            break
        after = page["data"][-1]["id"]
    return list_object(data, has_more=page["has_more"] and not all_pages)


@batches_app.command("cancel")
def batches_cancel(ctx: typer.Context, batch_id: Annotated[str, typer.Argument(metavar="ID")]):
    """Ask a batch to stop; finished results stay available."""
    state = ctx.obj
    emit(state, state.client().call("POST", f"batches/{_segment(batch_id)}/cancel"), show_batch)


@batches_app.command("retry")
def batches_retry(
    ctx: typer.Context,
    batch_id: Annotated[str, typer.Argument(metavar="ID")],
    wait: Annotated[bool, typer.Option("--wait", help="Wait for the new batch to finish, with a progress bar.")] = False,
    poll_interval: PollInterval = 1.0,
    download_dir: DownloadDir = None,
):
    """Run a finished batch's failed, expired and cancelled records again, as a new batch."""
    state = ctx.obj
    batch = state.client().call("POST", f"batches/{_segment(batch_id)}/retry")
    if not state.json:
        state.out.print(Text(f"Retrying {batch['request_counts']['total']:,} record(s) of {batch_id} as {batch['id']}."))
        show_batch(state, batch)
    if wait or download_dir:
        _waiting(state, batch["id"],
                 lambda: finish_waiting(state, batch, poll_interval, download_dir, rejections=False))
    elif state.json:
        print_json(batch)


@batches_app.command("results")
def batches_results(
    ctx: typer.Context,
    batch_id: Annotated[str, typer.Argument(metavar="ID")],
    output: Annotated[str, typer.Option("--output", "-o", help="Where to write; - for stdout.")],
    errors: Annotated[bool, typer.Option("--errors", help="The error lines instead of the output lines.")] = False,
):
    """Download the result lines of the records finished so far (the batch may still be running)."""
    state = ctx.obj
    kind = "error" if errors else "output"
    written = download_route(state.client(), f"batches/{_segment(batch_id)}/results?kind={kind}", output)
    report_saved(state, output, written, {"id": batch_id, "kind": kind}, f"{batch_id}'s {kind} lines so far")


@batches_app.command("wait")
def batches_wait(
    ctx: typer.Context,
    batch_id: Annotated[str, typer.Argument(metavar="ID")],
    poll_interval: PollInterval = 1.0,
    download_dir: DownloadDir = None,
):
    """Wait for a batch to finish; exit 3 if it ends failed, expired or cancelled."""
    state = ctx.obj
    batch = state.client().call("GET", f"batches/{_segment(batch_id)}")
    _waiting(state, batch_id, lambda: finish_waiting(state, batch, poll_interval, download_dir))


# ---------------------------------------------------------------------------
# files


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


# ---------------------------------------------------------------------------
# before submitting: models and limits


@app.command("models")
def models_list(ctx: typer.Context):
    """List the models a batch may use, with their concurrency and sync-rate prices."""
    state = ctx.obj
    page = state.client().call("GET", "models")
    if state.json:
        print_json(page)
        return
    table = Table()
    for column in ("model", "max concurrency", "input $/1M", "cached $/1M", "output $/1M"):
        table.add_column(column, no_wrap=column == "model")
    for model in page["data"]:
        extra = model.get("openrelay") or {}
        price = extra.get("price_per_mtok") or {}
        table.add_row(*(Text(str(v)) for v in (
            model["id"], extra.get("max_concurrency", "-"), price.get("input", "-"), price.get("cached_input", "-"),
            price.get("output", "-"))))
    state.out.print(table)
    state.out.print(Text("Batches bill these at 50% (standard) or 100% (expedited)."))


@app.command("limits")
def limits_show(ctx: typer.Context):
    """Show the limits your batches must keep."""
    state = ctx.obj
    limits = state.client().call("GET", "limits")
    if state.json:
        print_json(limits)
        return
    batch, organization = limits["batch"], limits["organization"]
    rows = [(name.replace("_", " "), ", ".join(value) if isinstance(value, list) else f"{value:,}"
             if isinstance(value, int) else str(value)) for name, value in batch.items()]
    rows += [(f"tool_config {name}", f"default {v['default']:,}, max {v['max']:,}")
             for name, v in limits["tool_config"].items()]
    rows += [(f"workflow {name}", f"default {v['default']:,}, max {v['max']:,}")
             for name, v in (limits["workflow"] or {}).items()]
    rows += [("workflows", "enabled" if organization["workflows_enabled"] else "off"),
             ("organization max concurrency", str(organization["max_concurrency"] or "no cap"))]
    state.out.print(_kv_table(rows))


# ---------------------------------------------------------------------------
# webhooks

BATCH_EVENTS = ["batch.completed", "batch.failed", "batch.expired", "batch.cancelled"]


@webhooks_app.command("create")
def webhooks_create(
    ctx: typer.Context,
    url: Annotated[str, typer.Argument(metavar="URL", help="Where the events are POSTed.")],
    name: Annotated[str | None, typer.Option("--name", help="A name for it (default: the URL).")] = None,
    events: Annotated[list[str] | None, typer.Option(
        "--event", help="An event to send (repeatable; default: every batch event).")] = None,
):
    """Register an endpoint; prints its signing secret, once."""
    state = ctx.obj
    body = {"name": name or url[:200], "url": url, "event_types": events or BATCH_EVENTS}
    emit(state, state.client().call("POST", "webhook_endpoints", json=body), show_webhook)


@webhooks_app.command("list")
def webhooks_list(
    ctx: typer.Context,
    limit: Annotated[int | None, typer.Option("--limit", min=1, max=100)] = None,
    after: Annotated[str | None, typer.Option("--after", help="Start after this endpoint id.")] = None,
):
    """List endpoints, newest first."""
    state = ctx.obj
    params = {k: v for k, v in (("limit", limit), ("after", after)) if v is not None}
    page = state.client().call("GET", "webhook_endpoints", params=params)
    emit_page(state, page, show_webhook_list)


@webhooks_app.command("get")
def webhooks_get(ctx: typer.Context, endpoint_id: Annotated[str, typer.Argument(metavar="ID")]):
    """Show one endpoint."""
    state = ctx.obj
    emit(state, state.client().call("GET", f"webhook_endpoints/{_segment(endpoint_id)}"), show_webhook)


@webhooks_app.command("delete")
def webhooks_delete(ctx: typer.Context, endpoint_id: Annotated[str, typer.Argument(metavar="ID")]):
    """Delete an endpoint (its undelivered events are dropped)."""
    state = ctx.obj
    deleted = state.client().call("DELETE", f"webhook_endpoints/{_segment(endpoint_id)}")
    emit(state, deleted, show_deleted)


@webhooks_app.command("rotate")
def webhooks_rotate(
    ctx: typer.Context,
    endpoint_id: Annotated[str, typer.Argument(metavar="ID")],
    keep_old: Annotated[bool, typer.Option("--keep-old", help="The old secret keeps signing for 24 hours.")] = False,
):
    """Replace the signing secret; prints the new one, once."""
    state = ctx.obj
    endpoint = state.client().call("POST", f"webhook_endpoints/{_segment(endpoint_id)}/rotate_secret",
                                   json={"keep_old_secret_active_for_24_hours": keep_old})
    emit(state, endpoint, show_webhook)


@webhooks_app.command("test")
def webhooks_test(
    ctx: typer.Context,
    endpoint_id: Annotated[str, typer.Argument(metavar="ID")],
    event: Annotated[str, typer.Option("--event", help="The sample event's type.")] = "batch.completed",
):
    """Send a signed sample event now and show what the endpoint answered."""
    state = ctx.obj
    result = state.client().call("POST", f"webhook_endpoints/{_segment(endpoint_id)}/test", json={"event_type": event})
    emit(state, result, lambda s, r: s.out.print(Text(
        f"Sent a sample {r['event_type']} to {r['webhook_endpoint_id']}: it answered HTTP {r['status_code']}.")))


if __name__ == "__main__":
    main()
