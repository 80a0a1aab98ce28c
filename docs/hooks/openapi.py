"""MkDocs hook: the API reference renders the OpenAPI document the product serves.

At each build it asks the product for its schema (`manage.py spectacular`, the generator behind
`GET /v1/openapi.json`), writes it into the site as `reference/openapi.json`, and replaces the
`<!-- openapi -->` marker of `reference/api.md` with one section an operation and one table a
schema. Rendering at build time, not from a committed copy, means a route added on any branch is
in the reference the moment it is served; tests/docs_tests reads the same `render` to check that
every route is there.

Why a hook and not a plugin: the OpenAPI plugins for MkDocs either embed Swagger UI (JavaScript:
nothing for `grep`, for `llms.txt` or for a reader without scripts) or need the schema as a file
in the docs folder before the build starts; this is 150 lines with no dependency.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = "reference/api.md"
MARKER = "<!-- openapi -->"
METHODS = ("get", "post", "put", "patch", "delete")

_schema: dict | None = None


def served_schema() -> dict:
    """The OpenAPI document, as `GET /v1/openapi.json` serves it, from a throwaway data folder."""
    with tempfile.TemporaryDirectory() as data_dir:
        out = Path(data_dir) / "openapi.json"
        env = {**os.environ, "OPENRELAY_DATA_DIR": data_dir}
        env.pop("DATABASE_URL", None)  # the generator reads no row; SQLite in the temp folder keeps it off any server
        subprocess.run(
            [sys.executable, "manage.py", "spectacular", "--format", "openapi-json", "--file", str(out)],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
        )
        return json.loads(out.read_text())


def _type(schema: dict) -> str:
    """A schema in a few words: `File`, `array of Batch`, `string (standard, expedited)`."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        return f"[`{name}`](#schema-{name.lower()})"
    if "allOf" in schema or "oneOf" in schema or "anyOf" in schema:
        parts = schema.get("allOf") or schema.get("oneOf") or schema.get("anyOf")
        return " or ".join(_type(part) for part in parts)
    kind = schema.get("type", "any")
    if kind == "array":
        return f"array of {_type(schema.get('items', {}))}"
    if "enum" in schema:
        return f"{kind}: " + ", ".join(f"`{value}`" for value in schema["enum"] if value is not None)
    if schema.get("nullable"):
        return f"{kind} or null"
    return kind


def _cell(text: str | None) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


def _operation(method: str, path: str, operation: dict) -> list[str]:
    lines = [f"### `{method.upper()} {path}`", "", _cell(operation.get("summary")), ""]
    if operation.get("description"):
        lines += [operation["description"].strip(), ""]
    parameters = operation.get("parameters", [])
    if parameters:
        lines += ["| parameter | in | required | type | meaning |", "|---|---|---|---|---|"]
        for parameter in parameters:
            required = "yes" if parameter.get("required") else "no"
            kind = _type(parameter.get("schema", {}))
            meaning = _cell(parameter.get("description"))
            lines.append(f"| `{parameter['name']}` | {parameter['in']} | {required} | {kind} | {meaning} |")
        lines.append("")
    body = operation.get("requestBody")
    if body:
        for content_type, media in body.get("content", {}).items():
            lines.append(f"Request body (`{content_type}`): {_type(media.get('schema', {}))}")
        lines.append("")
    lines += ["| status | meaning | body |", "|---|---|---|"]
    for status, response in operation.get("responses", {}).items():
        content = response.get("content", {})
        kinds = ", ".join(f"{_type(media.get('schema', {}))} (`{ct}`)" for ct, media in content.items())
        lines.append(f"| {status} | {_cell(response.get('description'))} | {kinds} |")
    return lines + [""]


def _component(name: str, schema: dict) -> list[str]:
    lines = [f"### `{name}` {{ #schema-{name.lower()} }}", ""]
    if schema.get("description"):
        lines += [_cell(schema["description"]), ""]
    properties = schema.get("properties", {})
    if not properties:
        return lines + [f"Type: {_type(schema)}", ""]
    required = set(schema.get("required", []))
    lines += ["| field | type | required | meaning |", "|---|---|---|---|"]
    for field, spec in properties.items():
        flag = "yes" if field in required else "no"
        lines.append(f"| `{field}` | {_type(spec)} | {flag} | {_cell(spec.get('description'))} |")
    return lines + [""]


def render(schema: dict) -> str:
    """Markdown for every operation (in the document's order) and every named schema."""
    lines = ["## Operations", ""]
    for path, operations in schema["paths"].items():
        for method in METHODS:
            if method in operations:
                lines += _operation(method, path, operations[method])
    lines += ["## Schemas", ""]
    for name, component in schema.get("components", {}).get("schemas", {}).items():
        lines += _component(name, component)
    return "\n".join(lines)


def on_pre_build(config, **kwargs):
    global _schema
    _schema = served_schema()


def on_page_markdown(markdown, page, config, files, **kwargs):
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"{PAGE} lost its {MARKER} marker: the rendered operations go there")
    return markdown.replace(MARKER, render(_schema))


def on_post_build(config, **kwargs):
    target = Path(config["site_dir"]) / "reference" / "openapi.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(_schema, indent=2))
