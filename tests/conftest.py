"""The suite's root conftest: registers the shared fixtures of tests/fixtures/ as pytest plugins.

pytest_plugins may only be set here (the rootdir's conftest). Every folder sees
these fixtures without importing them; plain helpers are in tests/helpers.py.
"""

import pytest
from hypothesis import HealthCheck, settings

# Before anything imports it: helpers' asserts report their operands, as a conftest's do.
pytest.register_assert_rewrite("tests.helpers")

# Hypothesis' own clocks (a 200 ms deadline an example, the health check on slow input generation)
# fail tests for the machine's load, not their code: a loaded 2-core machine drew 6 examples in
# 1.4 s and failed billing's exact-arithmetic property (issue 55). Each test's examples still run.
settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")

pytest_plugins = [
    "tests.fixtures.emptying",  # transactional tests delete their rows (no flush)
    "tests.fixtures.storage",  # tmp_storage
    "tests.fixtures.organizations",  # alice, bob, admin_user, sdk
    "tests.fixtures.simulator",  # sim_server, sim, fresh_sim, model
    "tests.fixtures.model_proxy",  # model_proxy (a LiteLLM-shaped proxy)
    "tests.fixtures.clusters",  # clusters (real q2 clusters)
    "tests.fixtures.live_stack",  # live_stack (a running web + cluster + simulator, shared)
    "tests.fixtures.tool_executor",  # executor_server, executor
    "tests.fixtures.workflow_callback",  # callback_server, callback
    "tests.fixtures.webhook_receiver",  # receiver, verifier
    "tests.fixtures.hanging_server",  # hanging
    "tests.fixtures.mcp_servers",  # official_server, stateless_server, auth_server
    "tests.fixtures.message_batches",  # claude, translated, native
]


def pytest_addoption(parser):
    parser.addini(
        "db_independent_modules",
        type="linelist",
        help="test modules or folders whose tests that ask for no database are marked db_independent",
    )


def _asks_for_the_database(item):
    return "django_db_setup" in getattr(item, "fixturenames", ()) or item.get_closest_marker("django_db") is not None


def pytest_collection_modifyitems(config, items):
    """The tier db_independent (pyproject.toml): given by module, checked on every test."""
    prefixes = [line.strip().rstrip("/") for line in config.getini("db_independent_modules") if line.strip()]
    root = config.rootpath
    for item in items:
        path = item.path.relative_to(root).as_posix() if item.path.is_relative_to(root) else str(item.path)
        listed = any(path == prefix or path.startswith(prefix + "/") for prefix in prefixes)
        if listed and not _asks_for_the_database(item):
            item.add_marker(pytest.mark.db_independent)
        elif item.get_closest_marker("db_independent") and _asks_for_the_database(item):
            raise pytest.UsageError(
                f"{item.nodeid} is marked db_independent but asks for the database: CI would run it on one only"
            )
