"""`orl models` and `orl limits`: what to look up before submitting a batch.

`models` lists the models a batch may name, with their concurrency and prices; `limits` the limits a
batch must keep. They are top-level commands, not a group: `catalog_app` is added to the root without
a name (app.py), and typer then lists its commands as the root's own.
"""

from __future__ import annotations

import typer
from rich.table import Table
from rich.text import Text

from openrelay.cli.output import _kv_table, print_json

catalog_app = typer.Typer()


@catalog_app.command("models")
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
        table.add_row(
            *(
                Text(str(v))
                for v in (
                    model["id"],
                    extra.get("max_concurrency", "-"),
                    price.get("input", "-"),
                    price.get("cached_input", "-"),
                    price.get("output", "-"),
                )
            )
        )
    state.out.print(table)
    windows = (page["data"][0].get("openrelay") or {}).get("completion_windows") if page["data"] else None
    shares = ", ".join(f"{w['window']} {_percent(w['rate'])}" for w in windows or [])
    state.out.print(Text(f"Standard batches bill these at their window's share ({shares}); expedited at 100%."))


def _percent(rate):
    return f"{float(rate) * 100:g}%"


@catalog_app.command("limits")
def limits_show(ctx: typer.Context):
    """Show the limits your batches must keep."""
    state = ctx.obj
    limits = state.client().call("GET", "limits")
    if state.json:
        print_json(limits)
        return
    batch, organization = limits["batch"], limits["organization"]
    rows = [
        (
            name.replace("_", " "),
            ", ".join(value) if isinstance(value, list) else f"{value:,}" if isinstance(value, int) else str(value),
        )
        for name, value in batch.items()
        if name != "windows"
    ]
    rows += [
        (f"window {w['window']}", f"{w['seconds']:,} s, bills {_percent(w['rate'])} of the sync price")
        for w in batch.get("windows", [])
    ]
    rows += [
        (f"tool_config {name}", f"default {v['default']:,}, max {v['max']:,}")
        for name, v in limits["tool_config"].items()
    ]
    rows += [
        (f"workflow {name}", f"default {v['default']:,}, max {v['max']:,}")
        for name, v in (limits["workflow"] or {}).items()
    ]
    rows += [
        ("workflows", "enabled" if organization["workflows_enabled"] else "off"),
        ("organization max concurrency", str(organization["max_concurrency"] or "no cap")),
        ("organization monthly budget", _budget_text(organization.get("budget"))),
    ]
    state.out.print(_kv_table(rows))


def _budget_text(budget):
    if not budget:
        return "none"
    exhausted = " (exhausted: creates are refused, running batches pause)" if budget["exhausted"] else ""
    return f"{budget['spent']} of {budget['budget']} {budget['currency']} spent this month{exhausted}"
