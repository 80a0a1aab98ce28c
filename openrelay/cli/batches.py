"""`orl batches`: create (upload and submit in one step), estimate, get, list, pause, resume, cancel,
retry, results, wait.

The commands register on `batches_app`, which app.py adds to the root as `batches`. Waiting and
its progress live in waiting.py, the tables in output.py.
"""

from __future__ import annotations

import json
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from openrelay.api.lists import list_object
from openrelay.cli.client import ApiFailure, CliError, _segment
from openrelay.cli.downloads import download_route
from openrelay.cli.files import _upload
from openrelay.cli.output import (
    emit,
    emit_page,
    print_json,
    report_saved,
    show_batch,
    show_batch_list,
    show_estimate,
)
from openrelay.cli.waiting import _waiting, finish_waiting


class Priority(StrEnum):
    standard = "standard"
    expedited = "expedited"


batches_app = typer.Typer(no_args_is_help=True, help="Create, inspect, wait for and cancel batches.")


def _check_metadata(values):
    # Checked while parsing so a bad pair is a usage error (exit 2) before anything is uploaded.
    for item in values or ():
        if not item.partition("=")[0] or "=" not in item:
            raise typer.BadParameter(f"expected key=value, got {item!r}")
    return values


def _check_max_cost(value):
    # Sent as a decimal string, so the cap is exact; checked here so a typo fails before an upload.
    if value is None:
        return None
    try:
        amount = Decimal(value)
    except InvalidOperation:
        raise typer.BadParameter(f"expected an amount of US dollars, got {value!r}") from None
    if not amount.is_finite() or amount <= 0:
        raise typer.BadParameter(f"expected an amount above 0, got {value!r}")
    return str(amount)


def _metadata_pairs(values):
    return dict(item.split("=", 1) for item in values or ())


PollInterval = Annotated[float, typer.Option("--poll-interval", min=0.05, help="Seconds between polls.")]
MaxCost = Annotated[
    str | None,
    typer.Option(
        "--max-cost",
        callback=lambda value: _check_max_cost(value),
        help="Spend cap in USD (e.g. 25 or 12.50): the batch pauses before it could cost more.",
    ),
]
# The options create and estimate share: an estimate takes create's arguments.
InputFile = Annotated[
    Path,
    typer.Option("--input-file", "-f", exists=True, dir_okay=False, readable=True, help="JSONL file of requests."),
]
Endpoint = Annotated[str, typer.Option("--endpoint", "-e", help="e.g. /v1/chat/completions")]
CompletionWindow = Annotated[
    str,
    typer.Option(
        "--window",
        "--completion-window",
        "-w",
        help="One of the offered windows (`orl limits`, e.g. 1h, 24h); each bills its own rate.",
    ),
]
Metadata = Annotated[
    list[str] | None,
    typer.Option("--metadata", "-m", callback=_check_metadata, help="key=value; repeat for more pairs."),
]
PriorityOption = Annotated[Priority | None, typer.Option("--priority")]
DownloadDir = Annotated[
    Path | None,
    typer.Option("--download", file_okay=False, help="Save the output and error files into this directory."),
]


@batches_app.command("create")
def batches_create(
    ctx: typer.Context,
    input_file: InputFile,
    endpoint: Endpoint,
    completion_window: CompletionWindow = "24h",
    metadata: Metadata = None,
    priority: PriorityOption = None,
    max_cost: MaxCost = None,
    output_contract: Annotated[
        Path | None,
        typer.Option(
            "--output-contract",
            exists=True,
            dir_okay=False,
            readable=True,
            help="A JSON Schema file every record's answer must match (re-asked when it does not).",
        ),
    ] = None,
    max_reasks: Annotated[
        int | None, typer.Option("--max-reasks", min=0, help="Re-asks a failing answer gets (default 2, at most 5).")
    ] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait for the batch to finish, with a progress bar.")] = False,
    poll_interval: PollInterval = 1.0,
    download_dir: DownloadDir = None,
):
    """Upload --input-file (purpose batch), then create a batch from it."""
    state = ctx.obj
    contract = _output_contract(output_contract, max_reasks)  # read before the upload: a bad file uploads nothing
    client = state.client()
    file = _upload(client, input_file)
    batch = _create_batch(
        client, file["id"], endpoint, completion_window, _metadata_pairs(metadata), priority, max_cost, contract
    )
    if not state.json:
        state.out.print(Text(f"Uploaded {input_file.name} as {file['id']} ({file['bytes']:,} bytes)."))
        show_batch(state, batch)
    if wait or download_dir:
        # The rejections were just shown with the new batch.
        _waiting(
            state, batch["id"], lambda: finish_waiting(state, batch, poll_interval, download_dir, rejections=False)
        )
    elif state.json:
        print_json(batch)


def _output_contract(schema_path, max_reasks):
    """The create's openrelay.output_contract from --output-contract and --max-reasks, or None."""
    if schema_path is None and max_reasks is None:
        return None
    contract = {}
    if schema_path is not None:
        try:
            contract["schema"] = json.loads(schema_path.read_text())
        except (OSError, ValueError) as exc:
            raise typer.BadParameter(
                f"{schema_path} is not a JSON file: {exc}", param_hint="--output-contract"
            ) from None
    if max_reasks is not None:
        contract["max_reasks"] = max_reasks
    return contract


def _create_batch(
    client, file_id, endpoint, completion_window, metadata, priority, max_cost=None, output_contract=None
):
    body = {"input_file_id": file_id, "endpoint": endpoint, "completion_window": completion_window}
    if metadata:
        body["metadata"] = metadata
    if priority is not None:
        body["priority"] = priority.value
    options = {"max_cost": max_cost, "output_contract": output_contract}
    if any(value is not None for value in options.values()):
        body["openrelay"] = {key: value for key, value in options.items() if value is not None}
    try:
        return client.call("POST", "batches", json=body)
    except ApiFailure:
        # The upload existed only for this batch; don't leave it behind.
        try:
            client.call("DELETE", f"files/{_segment(file_id)}")
        except CliError:
            pass
        raise


@batches_app.command("estimate")
def batches_estimate(
    ctx: typer.Context,
    input_file: InputFile,
    endpoint: Endpoint,
    completion_window: CompletionWindow = "24h",
    metadata: Metadata = None,
    priority: PriorityOption = None,
):
    """Quote a batch without creating it: records, tokens, cost, time, and whether it fits the window.

    Takes create's arguments. The file is uploaded for the quote and deleted after it."""
    state = ctx.obj
    client = state.client()
    file = _upload(client, input_file)
    body = {"input_file_id": file["id"], "endpoint": endpoint, "completion_window": completion_window}
    if metadata:
        body["metadata"] = _metadata_pairs(metadata)
    if priority is not None:
        body["priority"] = priority.value
    try:
        quote = client.call("POST", "batches/estimate", json=body)
    finally:
        try:
            client.call("DELETE", f"files/{_segment(file['id'])}")
        except CliError:
            pass
    emit(state, quote, show_estimate)


@batches_app.command("get")
def batches_get(ctx: typer.Context, batch_id: Annotated[str, typer.Argument(metavar="ID")]):
    """Show one batch."""
    state = ctx.obj
    emit(state, state.client().call("GET", f"batches/{_segment(batch_id)}"), show_batch)


@batches_app.command("list")
def batches_list(
    ctx: typer.Context,
    limit: Annotated[int | None, typer.Option("--limit", min=1, max=100, help="Page size (server default 20).")] = None,
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


@batches_app.command("pause")
def batches_pause(ctx: typer.Context, batch_id: Annotated[str, typer.Argument(metavar="ID")]):
    """Pause a running batch: it claims no new records; calls in flight finish and are billed."""
    state = ctx.obj
    emit(state, state.client().call("POST", f"batches/{_segment(batch_id)}/pause"), show_batch)


@batches_app.command("resume")
def batches_resume(
    ctx: typer.Context, batch_id: Annotated[str, typer.Argument(metavar="ID")], max_cost: MaxCost = None
):
    """Resume a paused batch where it stopped, optionally with a new spend cap."""
    state = ctx.obj
    body = {"max_cost": max_cost} if max_cost is not None else {}
    emit(state, state.client().call("POST", f"batches/{_segment(batch_id)}/resume", json=body), show_batch)


@batches_app.command("retry")
def batches_retry(
    ctx: typer.Context,
    batch_id: Annotated[str, typer.Argument(metavar="ID")],
    wait: Annotated[
        bool, typer.Option("--wait", help="Wait for the new batch to finish, with a progress bar.")
    ] = False,
    poll_interval: PollInterval = 1.0,
    download_dir: DownloadDir = None,
):
    """Run a finished batch's failed, expired and cancelled records again, as a new batch."""
    state = ctx.obj
    batch = state.client().call("POST", f"batches/{_segment(batch_id)}/retry")
    if not state.json:
        state.out.print(
            Text(f"Retrying {batch['request_counts']['total']:,} record(s) of {batch_id} as {batch['id']}.")
        )
        show_batch(state, batch)
    if wait or download_dir:
        _waiting(
            state, batch["id"], lambda: finish_waiting(state, batch, poll_interval, download_dir, rejections=False)
        )
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
