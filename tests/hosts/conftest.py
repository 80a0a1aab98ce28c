"""The many-machines tier (marker `hosts`): the product on hosts in network namespaces.

Every test here is marked `hosts` (pyproject.toml; .ci/run runs the tier once, in its PostgreSQL pass).
The topology is made once a module and removed however the module ends; where namespaces cannot be
made, each test fails saying why (never a skip: CI runs as root on Linux, where they can).
"""

import pytest

from tests.hosts.netns import NamespacesUnavailable
from tests.hosts.topology import Topology

# Short leases so a lost host's records come back within seconds (documented settings, as an operator
# sets them): a lease of 4 s is renewed every second.
SETTINGS = {"OPENRELAY_LEASE_S": "4"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.parent.name == "hosts" and item.path.parent.parent.name == "tests":
            item.add_marker(pytest.mark.hosts)


@pytest.fixture(scope="module")
def topology(tmp_path_factory):
    logs = tmp_path_factory.mktemp("hosts-logs")
    try:
        built = Topology(logs, SETTINGS)
    except NamespacesUnavailable as exc:
        pytest.fail(f"the many-machines tier cannot run here: {exc}", pytrace=False)
    try:
        yield built.start()
    finally:
        built.close()


@pytest.fixture
def hosts(topology):
    """The module's topology, healed and its model server's counts zeroed, for one scenario."""
    topology.heal()
    topology.sim_reset()
    return topology
