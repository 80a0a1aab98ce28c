"""orl models and orl limits against a live server."""

import json

from openrelay.core.models import Model


def test_models_and_limits(orl, alice, model):
    Model.objects.create(name="openrelay/off", enabled=False)
    table = orl("models")
    assert table.exit_code == 0, table.output
    assert "openrelay/gemma-4-31b" in table.stdout and "openrelay/off" not in table.stdout
    listed = json.loads(orl("--json", "models").stdout)
    assert [m["id"] for m in listed["data"]] == ["openrelay/gemma-4-31b"]
    assert listed["data"][0]["openrelay"]["max_concurrency"] == 8

    limits = orl("limits")
    assert limits.exit_code == 0, limits.output
    assert "max requests" in limits.stdout and "50,000" in limits.stdout and "no cap" in limits.stdout
    assert json.loads(orl("--json", "limits").stdout)["batch"]["max_requests"] == 50_000
