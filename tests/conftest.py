"""The suite's root conftest: registers the shared fixtures of tests/fixtures/ as pytest plugins.

pytest_plugins may only be set here (the rootdir's conftest). Every folder sees
these fixtures without importing them; plain helpers are in tests/helpers.py.
"""

import pytest

# Before anything imports it: helpers' asserts report their operands, as a conftest's do.
pytest.register_assert_rewrite("tests.helpers")

pytest_plugins = [
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
]
