"""`orl webhooks`: create, list, get, delete, rotate and test the endpoints that receive batch events.

The commands register on `webhooks_app`, which app.py adds to the root as `webhooks`. A signing
secret is printed only when the server returns it (create, rotate): once.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.text import Text

from openrelay.cli.client import _segment
from openrelay.cli.output import emit, emit_page, show_deleted, show_webhook, show_webhook_list

webhooks_app = typer.Typer(no_args_is_help=True, help="Endpoints that receive batch events (signed POSTs).")

# The default: OpenAI's four, a batch's end. OpenRelay's batch.paused and batch.resumed are asked for by name.
BATCH_EVENTS = ["batch.completed", "batch.failed", "batch.expired", "batch.cancelled"]


@webhooks_app.command("create")
def webhooks_create(
    ctx: typer.Context,
    url: Annotated[str, typer.Argument(metavar="URL", help="Where the events are POSTed.")],
    name: Annotated[str | None, typer.Option("--name", help="A name for it (default: the URL).")] = None,
    events: Annotated[
        list[str] | None,
        typer.Option(
            "--event",
            help="An event to send (repeatable; default: the four batch ends; also batch.paused, batch.resumed).",
        ),
    ] = None,
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
    endpoint = state.client().call(
        "POST",
        f"webhook_endpoints/{_segment(endpoint_id)}/rotate_secret",
        json={"keep_old_secret_active_for_24_hours": keep_old},
    )
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
    emit(
        state,
        result,
        lambda s, r: s.out.print(
            Text(f"Sent a sample {r['event_type']} to {r['webhook_endpoint_id']}: it answered HTTP {r['status_code']}.")
        ),
    )
