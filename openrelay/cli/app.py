"""The root of `orl`: the typer app, its global options, the State every command gets, and `main`.

The root group moves the global options (--json, --api-key, --base-url) in front of the command
wherever they were typed, and turns a CliError from any command into stderr text and an exit
code. The command groups live in their own modules; this one imports them and adds their typer
apps, so importing it (as `main` and the tests do) registers every command.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text
from typer.core import TyperGroup

# The command groups: importing them registers their commands on their typer apps, which are added
# to the root below. They import nothing from here, so there is no cycle.
from openrelay.cli.batches import batches_app
from openrelay.cli.catalog import catalog_app
from openrelay.cli.client import EXIT_USAGE, Client, CliError
from openrelay.cli.files import files_app
from openrelay.cli.webhooks import webhooks_app

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
PLAIN_WIDTH = 200  # tables in pipes and logs: wide enough that ids never wrap


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
app = typer.Typer(
    cls=_Group,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="OpenRelay Batch: upload inputs, run batches, fetch results.",
)
# catalog_app has no name: its commands (models, limits) are the root's own, listed first as before.
app.add_typer(catalog_app)
app.add_typer(batches_app, name="batches")
app.add_typer(files_app, name="files")
app.add_typer(webhooks_app, name="webhooks")


@app.callback()
def root(
    ctx: typer.Context,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key", help="API key (default: $OPENRELAY_API_KEY, which ps can't see).", show_default=False
        ),
    ] = None,
    base_url: Annotated[
        str | None,
        typer.Option(
            "--base-url", help=f"API base URL (default: $OPENRELAY_BASE_URL or {DEFAULT_BASE_URL}).", show_default=False
        ),
    ] = None,
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
