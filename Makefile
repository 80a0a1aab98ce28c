# Everyday commands, each one line over the venv's tools (make the venv with the README's test command).
# Pass pytest or bench options with ARGS, e.g. make test ARGS="tests/core_tests -q", make bench ARGS="--only e2e".
VENV ?= .venv
ARGS ?=
PG_URL ?= postgres://postgres@127.0.0.1:5432/openrelay
REDIS ?= redis://127.0.0.1:6379/0

.PHONY: lint fmt test test-pg bench docs docs-build

# ruff's rules and format, the import layers of docs/architecture.md, then mypy on pyproject's [tool.mypy] files (all in .ci/run).
lint:
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && $(VENV)/bin/lint-imports && $(VENV)/bin/mypy

# The house format (ruff format; .ci/run checks it with --check).
fmt:
	$(VENV)/bin/ruff format $(or $(ARGS),.)

# The embedded default: SQLite and the ORM broker in a throwaway data dir.
test:
	env -u DATABASE_URL -u REDIS_URL OPENRELAY_DATA_DIR="$$(mktemp -d)" $(VENV)/bin/python -m pytest $(ARGS)

# PostgreSQL + Redis as .ci/run sets them (it also creates the openrelay database).
test-pg:
	DATABASE_URL="$(PG_URL)" REDIS_URL="$(REDIS)" OPENRELAY_DATA_DIR="$$(mktemp -d)" $(VENV)/bin/python -m pytest $(ARGS)

# tests/perf from this checkout (the bench extra: pip install -e ".[bench]"); docs/performance.md.
bench:
	$(VENV)/bin/python manage.py bench $(ARGS)

# The documentation site (the docs extra: pip install -e ".[docs]"), served at http://127.0.0.1:8008/ as you edit.
docs:
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

# What .ci/run builds: strict, so a broken link, anchor or nav entry fails.
docs-build:
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict
