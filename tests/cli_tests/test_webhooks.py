"""orl webhooks create / list / get / test / rotate / delete against a live server and a real receiver."""

import json


def test_the_webhook_commands(orl, alice, receiver, verifier):
    created = orl(
        "webhooks", "create", receiver.url, "--name", "ci", "--event", "batch.completed", "--event", "batch.failed"
    )
    assert created.exit_code == 0, created.output
    secret = next(line.split(": ")[1] for line in created.stdout.splitlines() if "Signing secret" in line).strip()
    assert secret.startswith("whsec_")
    endpoint = json.loads(orl("--json", "webhooks", "list").stdout)["data"][0]
    assert (endpoint["name"], endpoint["event_types"]) == ("ci", ["batch.completed", "batch.failed"])
    assert "signing_secret" not in endpoint

    shown = orl("webhooks", "get", endpoint["id"])
    assert shown.exit_code == 0 and receiver.url in shown.stdout and secret not in shown.stdout

    tested = orl("webhooks", "test", endpoint["id"], "--event", "batch.failed")
    assert tested.exit_code == 0 and "it answered HTTP 200" in tested.stdout
    sample = receiver.received[-1]
    assert verifier.unwrap(sample.body, sample.headers, secret=secret).type == "batch.failed"

    rotated = json.loads(orl("--json", "webhooks", "rotate", endpoint["id"], "--keep-old").stdout)
    assert rotated["signing_secret"].startswith("whsec_") and rotated["signing_secret"] != secret

    everything = json.loads(orl("--json", "webhooks", "create", receiver.url).stdout)
    assert everything["event_types"] == ["batch.completed", "batch.failed", "batch.expired", "batch.cancelled"]

    refused = orl("webhooks", "create", receiver.url, "--event", "video.completed")
    assert refused.exit_code == 1 and "batch events only" in refused.stderr

    deleted = orl("webhooks", "delete", endpoint["id"])
    assert deleted.exit_code == 0 and f"Deleted {endpoint['id']}." in deleted.stdout
    missing = orl("webhooks", "get", endpoint["id"])
    assert missing.exit_code == 1 and "No webhook endpoint found" in missing.stderr
