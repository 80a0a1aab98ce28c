"""What the commands print: JSON for --json, else rich tables of batches, files and webhook endpoints.

Every renderer takes the State (app.py) and writes to its `out` console (stdout); `emit` and
`emit_page` choose between JSON and a renderer, so each command states once what it shows.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import typer
from rich.table import Table
from rich.text import Text

from openrelay.api.timestamps import BATCH_TIMESTAMPS

REJECTIONS_SHOWN = 20


def print_json(value):
    typer.echo(json.dumps(value, indent=2, ensure_ascii=False))


def _when(timestamp):
    if timestamp is None:
        return "-"
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _cost(batch):
    # OpenRelay's extension object carries the cost; `usage` is OpenAI's five fields.
    return (batch.get("openrelay") or {}).get("cost")


def _cost_text(cost):
    return f"{cost['total']} {cost.get('currency', '')}".strip()


def _kv_table(rows):
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for label, value in rows:
        table.add_row(label, Text(str(value)))
    return table


def _status_text(batch):
    """The status, with ` (paused)` while the batch is paused (its status stays OpenAI's)."""
    paused = (batch.get("openrelay") or {}).get("paused")
    return f"{batch['status']} (paused)" if paused else batch["status"]


def _guardrail_rows(extension):
    """Why and since when the batch is paused, and its spend cap."""
    rows = []
    paused = extension.get("paused")
    if paused:
        rows.append(("paused", f"{paused['reason']} since {_when(paused['since'])}"))
        if paused.get("message"):
            rows.append(("pause reason", paused["message"]))
    if extension.get("max_cost"):
        rows.append(("max cost", f"{extension['max_cost']} USD"))
    return rows


def _batch_rows(batch):
    counts = batch["request_counts"]
    rows = [
        ("id", batch["id"]),
        ("status", _status_text(batch)),
        ("endpoint", batch["endpoint"]),
        ("model", batch.get("model") or "-"),
        ("priority", batch.get("priority") or "-"),
        ("input file", batch["input_file_id"]),
        ("output file", batch.get("output_file_id") or "-"),
        ("error file", batch.get("error_file_id") or "-"),
        ("requests", f"total {counts['total']}  completed {counts['completed']}  failed {counts['failed']}"),
    ]
    contracts = (batch.get("openrelay") or {}).get("output_contracts") or {}
    if any(contracts.values()):
        rows.append(
            (
                "re-asks",
                f"records {contracts.get('reasked', 0):,}  re-asks {contracts.get('reasks', 0):,}  "
                f"invalid output {contracts.get('invalid_output', 0):,}",
            )
        )
    usage = batch.get("usage")
    if usage:
        rows.append(
            (
                "tokens",
                f"input {usage['input_tokens']:,} (cached "
                f"{usage['input_tokens_details']['cached_tokens']:,})  output "
                f"{usage['output_tokens']:,}  total {usage['total_tokens']:,}",
            )
        )
    cost = _cost(batch)
    if cost:
        rows.append(
            (
                "cost",
                f"{_cost_text(cost)}  (input {cost['input']}, cached input {cost['cached_input']}, "
                f"output {cost['output']})",
            )
        )
    rows += _guardrail_rows(batch.get("openrelay") or {})
    if batch.get("metadata"):
        rows.append(("metadata", ", ".join(f"{k}={v}" for k, v in batch["metadata"].items())))
    # In the order the batch lived them, its deadline (expires_at) after what happened.
    for name in sorted(BATCH_TIMESTAMPS, key="expires_at".__eq__):
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
        table.add_row(
            *(
                Text(str(v))
                for v in (
                    "-" if line is None else line,
                    error.get("code") or "-",
                    error.get("param") or "-",
                    error.get("message") or "",
                )
            )
        )
    state.out.print(table)
    if len(rejected) > REJECTIONS_SHOWN:
        state.out.print(Text(f"... and {len(rejected) - REJECTIONS_SHOWN} more: orl --json batches get {batch['id']}"))


def show_estimate(state, quote):
    """A quote (POST /v1/batches/estimate): each figure with how it was made, then the notes and rejections."""
    state.out.print(_kv_table(_estimate_rows(quote)))
    for note in quote.get("notes") or ():
        state.out.print(Text(f"note: {note}"))
    show_rejections(state, {**quote, "id": "(estimate)"})


def _estimate_rows(quote):
    counts = quote["request_counts"]
    rows = [
        ("model", quote.get("model") or "-"),
        ("records", f"{counts['total']:,} accepted  {counts['rejected']:,} rejected"),
    ]
    tokens, output, cost, time = (quote.get(k) for k in ("input_tokens", "output_tokens", "cost", "time"))
    if tokens:
        how = tokens["method"]
        if tokens["sampled"]:
            how += f", {tokens['counted_records']:,} of {tokens['records']:,} records counted"
        if tokens["error_pct"]:
            how += f", ±{tokens['error_pct']}%"
        rows.append(("input tokens", f"{tokens['total']:,} ({how})"))
    if output:
        rows.append(
            (
                "output tokens",
                f"{output['low']:,} / {output['expected']:,} / {output['high']:,} "
                f"low/expected/high ({output['basis']})",
            )
        )
    if quote.get("tool_rounds"):
        rounds = quote["tool_rounds"]
        rows.append(("tool rounds", f"{rounds['expected']} a record over {rounds['records']:,} ({rounds['basis']})"))
    if cost:
        rows.append(
            ("cost", f"{cost['low']} / {cost['expected']} / {cost['high']} {cost['currency']} low/expected/high")
        )
    if time:
        rows.append(("duration", _duration_text(time)))
        rows.append(("expected done", _when(time["expected_completion_at"])))
        queued = time["queued_ahead"]
        rows.append(("queued ahead", f"{queued['records']:,} records in {queued['batches']} batch(es)"))
    rows.append(
        ("fits window", {True: "yes", False: "no", "at_risk": "at risk", None: "unknown"}[quote["fits_window"]])
    )
    rows.append(("confidence", quote["confidence"]))
    return rows


def _duration_text(time):
    if time["expected_duration_s"] is None:
        return f"unknown ({time['basis']})"
    low, expected, high = (_span(time[k]) for k in ("low_duration_s", "expected_duration_s", "high_duration_s"))
    return f"{expected} (low {low}, high {high}; pace: {time['basis']})"


def _span(seconds):
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds / 3600:.1f} h"


def show_batch_list(state, batches, has_more):
    table = Table()
    for column in ("id", "status", "endpoint", "model", "done", "failed", "created"):
        table.add_column(column, no_wrap=column == "id")
    for batch in batches:
        counts = batch["request_counts"]
        table.add_row(
            *(
                Text(str(v))
                for v in (
                    batch["id"],
                    _status_text(batch),
                    batch["endpoint"],
                    batch.get("model") or "-",
                    f"{counts['completed'] + counts['failed']}/{counts['total']}",
                    counts["failed"],
                    _when(batch["created_at"]),
                )
            )
        )
    state.out.print(table)
    if has_more:
        state.out.print(Text(f"More: orl batches list --after {batches[-1]['id']} (or --all)"))


def show_file(state, file):
    state.out.print(
        _kv_table(
            [
                ("id", file["id"]),
                ("filename", file["filename"]),
                ("purpose", file["purpose"]),
                ("bytes", f"{file['bytes']:,}"),
                ("created", _when(file["created_at"])),
                ("expires", _when(file.get("expires_at"))),
            ]
        )
    )


def show_file_list(state, files, has_more):
    table = Table()
    for column in ("id", "filename", "purpose", "bytes", "created", "expires"):
        table.add_column(column, no_wrap=column == "id")
    for file in files:
        table.add_row(
            *(
                Text(str(v))
                for v in (
                    file["id"],
                    file["filename"],
                    file["purpose"],
                    f"{file['bytes']:,}",
                    _when(file["created_at"]),
                    _when(file.get("expires_at")),
                )
            )
        )
    state.out.print(table)
    if has_more:
        state.out.print(Text(f"More: orl files list --after {files[-1]['id']}"))


def show_webhook(state, endpoint):
    rows = [
        ("id", endpoint["id"]),
        ("name", endpoint["name"]),
        ("url", endpoint["url"]),
        ("events", ", ".join(endpoint["event_types"])),
        ("secret", endpoint.get("signing_secret_hint") or "-"),
        ("created", _when(endpoint["created_at"])),
    ]
    state.out.print(_kv_table(rows))
    if endpoint.get("signing_secret"):
        # Shown by the server this once (create, rotate): the receiver needs it to check signatures.
        state.out.print(
            Text(f"Signing secret (shown once, keep it): {endpoint['signing_secret']}", style="bold"), soft_wrap=True
        )  # never folded: it is copied whole


def show_webhook_list(state, endpoints, has_more):
    table = Table()
    for column in ("id", "name", "url", "events", "created"):
        table.add_column(column, no_wrap=column == "id")
    for endpoint in endpoints:
        table.add_row(
            *(
                Text(str(v))
                for v in (
                    endpoint["id"],
                    endpoint["name"],
                    endpoint["url"],
                    ", ".join(endpoint["event_types"]),
                    _when(endpoint["created_at"]),
                )
            )
        )
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
