"""The deploy recipe as the hosts run it: commands and environment read from deploy/compose.yaml.

compose.yaml is the one place that says how the product's parts run (`migrate`, `web`, `worker`): its
`command` and its `environment`, whose `${VAR}`, `${VAR:-default}` and `${VAR:?message}` are filled
from the operator's values as compose fills them from the shell. The hosts of tests/hosts run exactly
that (test_recipe.py checks that the systemd units and the Helm chart say the same).
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.helpers import ROOT

DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "compose.yaml"
WORKERS_COMPOSE = DEPLOY / "compose.workers.yaml"
PRODUCT_SERVICES = ("migrate", "web", "worker")
VARIABLE = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


class MissingVariable(KeyError):
    """A `${VAR:?message}` the operator's values leave unset (compose refuses to start then too)."""


def load(path: Path = COMPOSE) -> dict[str, Any]:
    with open(path) as file:
        return yaml.safe_load(file)


def interpolate(text: str, values: dict[str, str]) -> str:
    """Compose's interpolation: `${VAR}`, `${VAR:-default}` (unset or empty), `${VAR-default}` (unset),
    `${VAR:?message}` and `${VAR?message}` (an error)."""

    def fill(match: re.Match[str]) -> str:
        name, op, arg = match["name"], match["op"], match["arg"]
        value = values.get(name)
        if op in (":-", ":?") and not value or op in ("-", "?") and value is None:
            if op.endswith("?"):
                raise MissingVariable(f"{name}: {arg}")
            return arg
        return value or ""

    return VARIABLE.sub(fill, text)


def service(name: str, values: dict[str, str], path: Path = COMPOSE) -> tuple[list[str], dict[str, str]]:
    """The `command` and the environment of one service of compose.yaml, with the operator's `values`.

    Variables that come out empty are left out, as an unset one: compose would pass them empty, which the
    product reads as unset too (settings' env helpers), but boto3 would not for its credentials.
    """
    declared = load(path)["services"][name]
    argv = [interpolate(str(word), values) for word in declared["command"]]
    environment = {key: interpolate(str(value), values) for key, value in declared.get("environment", {}).items()}
    return argv, {key: value for key, value in environment.items() if value != ""}


def local_argv(argv: list[str]) -> list[str]:
    """A container's command as this checkout runs it: `python` is this interpreter and the other
    programs its virtualenv's (the image's PATH starts with its virtualenv's bin)."""
    program, *rest = argv
    if program in ("python", "python3"):
        return [sys.executable, *rest]
    beside = Path(sys.executable).parent / program
    return [str(beside) if beside.exists() else shutil.which(program) or program, *rest]
