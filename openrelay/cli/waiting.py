"""Waiting for a batch: polling until it ends, the progress it shows meanwhile, and the outcome.

On a terminal the progress is rich's live bar, in a pipe or a CI log one plain line per change;
both go to stderr. Polling rides out a few transient failures, Ctrl-C stops the waiting and not
the batch, and a batch that ends failed, expired or cancelled exits 3.
"""

from __future__ import annotations

import time

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn
from rich.text import Text

from openrelay.cli.client import EXIT_BATCH_UNSUCCESSFUL, CliError, _segment
from openrelay.cli.downloads import download_results
from openrelay.cli.output import _cost, _cost_text, print_json, show_rejections

TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
UNSUCCESSFUL = frozenset({"failed", "expired", "cancelled"})
# A wait can last hours: a server restart or proxy hiccup mid-wait should
# not end it, so polling tolerates a few consecutive transient failures.
POLL_RETRIES = 5


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
        self.progress = (
            Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[detail]}"),
                console=console,
                transient=False,
            )
            if self.live
            else None
        )
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


def show_outcome(state, batch, saved, rejections):
    counts = batch["request_counts"]
    state.out.print(
        Text(
            f"Batch {batch['id']} {batch['status']}: {counts['completed']} completed, "
            f"{counts['failed']} failed of {counts['total']}.",
            style="bold",
        )
    )
    downloaded = {kind: path for kind, _, path in saved}
    for kind in ("output", "error"):
        file_id = batch.get(f"{kind}_file_id")
        if kind in downloaded:
            state.out.print(Text(f"{kind.capitalize()} file {file_id} saved to {downloaded[kind]}"))
        elif file_id:
            state.out.print(
                Text(
                    f"{kind.capitalize()} file {file_id}: orl files content get {file_id} -o {batch['id']}_{kind}.jsonl"
                )
            )
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
