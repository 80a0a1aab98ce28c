"""Contracts' counts where people look: GET /metrics and the dashboard's batch page."""

import re

from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from openrelay.core.models import Membership
from tests.contract_tests.conftest import chat_body, line, person_format, run
from tests.helpers import MODEL

TOKEN = "metrics-token-contracts"


def figures(text):
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def contract_lines():
    return [
        line("fixed", chat_body("A [[invalid_output:wrong_type]]", response_format=person_format())),
        line("stuck", chat_body("B [[invalid_output:wrong_typex9]]", response_format=person_format())),
        line("fine", chat_body("C", response_format=person_format())),
    ]


def test_metrics_count_reasks_and_invalid_outputs_by_model(alice, model, sim, settings):
    settings.OPENRELAY_METRICS_TOKEN = TOKEN
    run(alice, contract_lines())
    text = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").content.decode()
    got = figures(text)

    def value(name, **labels):
        return got[(name, frozenset(labels.items()))]

    assert value("openrelay_output_contracts_total", model=MODEL, kind="reasked") == 2
    assert value("openrelay_output_contracts_total", model=MODEL, kind="reasks") == 1 + 2
    assert value("openrelay_output_contracts_total", model=MODEL, kind="invalid_output") == 1
    assert value("openrelay_records_finished_total", model=MODEL, outcome="invalid_output") == 1
    assert value("openrelay_records_finished_total", model=MODEL, outcome="succeeded") == 2


def test_the_batch_page_shows_reasks_beside_the_failures_by_code(alice, model, sim, django_user_model):
    batch, _, _ = run(alice, contract_lines())
    user = django_user_model.objects.create_user("alice")
    Membership.objects.create(user=user, organization=alice.org)
    client = Client()
    client.force_login(user)
    page = client.get(f"/batches/{batch.public_id}").content.decode()
    assert re.search(r'data-code="invalid_output"[^>]*>.*?data-count>1</td>', page, re.S)
    shown = dict(re.findall(r'<span data-field="(reasked|reasks|invalid_output)">([\d,]+)</span>', page))
    assert shown == {"reasked": "2", "reasks": "3", "invalid_output": "1"}
