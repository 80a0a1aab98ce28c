"""The reference pages keep up with the code: every variable openrelay/settings.py reads has a row in
docs/reference/settings.md, and every route the product serves is in docs/reference/api.md as the
site renders it (the hand-written routes plus the operations of the served OpenAPI document)."""

import ast
import importlib.util
import re

import pytest
from django.urls import URLPattern, URLResolver, get_resolver

from batches.dashboard.routing import websocket_urlpatterns
from openrelay.web.probes import PATHS as PROBE_PATHS
from tests.helpers import ROOT

SETTINGS = ROOT / "openrelay" / "settings.py"
SETTINGS_PAGE = ROOT / "docs" / "reference" / "settings.md"
API_PAGE = ROOT / "docs" / "reference" / "api.md"
ENV_READERS = ("envstr", "envint", "envfloat", "envbool", "envlist", "envrate")


def settings_read():
    """(variable, line) for every env helper call in settings.py whose first argument names a variable."""
    tree = ast.parse(SETTINGS.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ENV_READERS and node.args:
            name = node.args[0]
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                yield name.value, node.lineno


def documented_variables():
    """The variables named in the first column of the page's tables."""
    names = set()
    for row in re.findall(r"^\| ([^|]+)\|", SETTINGS_PAGE.read_text(), re.M):
        names.update(re.findall(r"`([A-Z][A-Z0-9_]+)`", row))
    return names


def test_it_documents_every_setting_in_the_settings_reference():
    documented = documented_variables()
    missing = [(name, line) for name, line in settings_read() if name not in documented]
    parts = re.split(r"^## ", SETTINGS_PAGE.read_text(), flags=re.M)[1:]
    sections = "; ".join(part.split("\n", 1)[0] for part in parts if "| variable | default | meaning |" in part)

    assert not missing, "\n".join(
        f"{name} (openrelay/settings.py line {line}) has no row in docs/reference/settings.md: add "
        f"'| `{name}` | <default> | <what it does> |' to the table of the section it belongs to ({sections})"
        for name, line in missing
    )


def test_the_settings_check_reads_the_settings_module():
    # Guards the test above against passing on nothing: the helpers' names or the file's shape changed.
    names = {name for name, _ in settings_read()}
    assert {"DATABASE_URL", "REDIS_URL", "OPENRELAY_LEASE_S", "OPENRELAY_STORAGE_ATTEMPTS"} <= names
    assert len(names) > 50


def _routes(patterns, prefix=""):
    for pattern in patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            if route == "admin/":
                yield route  # Django's admin: its own routes, documented as one entry
            else:
                yield from _routes(pattern.url_patterns, route)
        elif isinstance(pattern, URLPattern):
            yield route


def served_routes():
    """Every path the product answers, in the reference's spelling: /v1/batches/{batch_id}."""
    routes = list(_routes(get_resolver().url_patterns)) + list(_routes(websocket_urlpatterns))
    spelled = {"/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route) for route in routes}
    return spelled | set(PROBE_PATHS)


def openapi_hook():
    spec = importlib.util.spec_from_file_location("docs_openapi_hook", ROOT / "docs" / "hooks" / "openapi.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.django_db
def test_it_lists_every_route_in_the_api_reference(client):
    hook = openapi_hook()
    schema = client.get("/v1/openapi.json").json()  # the document the product serves, which the site renders
    page = API_PAGE.read_text().replace(hook.MARKER, hook.render(schema))

    missing = [route for route in sorted(served_routes()) if not re.search(re.escape(route) + r"(?![\w/{])", page)]

    assert not missing, (
        f"routes served but not in docs/reference/api.md: {missing}. A /v1 route appears there by itself once the "
        "OpenAPI document describes it (extend_schema on its view, openrelay/api/openapi.py); any other route "
        "needs a row in one of the page's hand-written tables"
    )
    assert "`POST /v1/batches`" in page and "`GET /v1/files/{file_id}/content`" in page  # the rendered part


def orl_commands(command, words=()):
    """Every leaf command of `orl`, as typed: "batches create", "files content get", "models"."""
    subcommands = getattr(command, "commands", None)
    if subcommands is None:
        yield " ".join(words)
        return
    for name, sub in subcommands.items():
        yield from orl_commands(sub, (*words, name))


def test_it_shows_every_orl_command_in_the_cli_reference():
    import typer

    from openrelay.cli.app import app

    page = (ROOT / "docs" / "reference" / "cli.md").read_text()
    commands = sorted(orl_commands(typer.main.get_command(app)))

    missing = [command for command in commands if not re.search(rf"orl {re.escape(command)}\b", page)]

    assert len(commands) > 15
    assert not missing, f"orl commands with no example in docs/reference/cli.md: {missing}"


def test_the_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    documented = re.search(r"\*\*2\. .*?```sh\n(.*?)\n```", readme, re.S).group(1)
    ci = (ROOT / ".ci" / "run").read_text()
    body = re.search(r"test_command\(\) \{\n(.*?)\n\}", ci, re.S).group(1)
    ran = " ".join(body.replace("\\\n", " ").split()).replace(' "$@"', "")

    assert ran == " ".join(documented.split()), "README's second command and .ci/run's test_command() differ"
