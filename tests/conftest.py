"""Shared fixtures: personas (alice and bob in their own organizations, an admin)."""

from dataclasses import dataclass

import pytest
from rest_framework.test import APIClient

from openrelay.core.models import ApiKey, Organization


@dataclass
class Persona:
    org: Organization
    key: str
    client: APIClient


def make_persona(name, **org_fields):
    org = Organization.objects.create(name=name, **org_fields)
    _, key = ApiKey.issue(org, name=f"{name} key")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return Persona(org=org, key=key, client=client)


@pytest.fixture
def alice(db):
    return make_persona("alice-org")


@pytest.fixture
def bob(db):
    return make_persona("bob-org")


@pytest.fixture
def admin_user(db, django_user_model):
    return django_user_model.objects.create_superuser("admin", "admin@example.com", "admin-password")


@pytest.fixture(scope="session")
def sim_server():
    """One simulated model server for the session (tests that need knobs start their own)."""
    from openrelay.simulator.config import SimulatorConfig
    from openrelay.simulator.server import run_in_thread

    with run_in_thread(SimulatorConfig()) as server:
        yield server


@pytest.fixture
def sim(sim_server):
    sim_server.reset()
    return sim_server
