"""Fixtures for the Batches API tests: storage in tmp_path, catalog models."""

import pytest

from openrelay.core.models import Deployment, Model
from tests.batches_api_tests.helpers import GEMMA, QWEN


@pytest.fixture(autouse=True)
def _storage(tmp_storage):
    """Every Batches API test keeps its stored files in tmp_path."""


def _catalog_model(name):
    model = Model.objects.create(name=name)
    Deployment.objects.create(model=model, base_url="http://127.0.0.1:9/v1")
    return model


@pytest.fixture
def gemma(db):
    return _catalog_model(GEMMA)


@pytest.fixture
def qwen(db):
    return _catalog_model(QWEN)
