"""/v1/webhook_endpoints through the unchanged OpenAI SDK, and its refusals."""

import openai
import pytest

from webhooks.models import WebhookEndpoint

EVENTS = ["batch.completed", "batch.failed"]


def test_create_retrieve_list_update_delete(sdk, receiver, alice):
    created = sdk.webhooks.create(name="results", url=receiver.url, event_types=EVENTS)
    assert created.object == "webhook_endpoint" and created.id.startswith("wh_")
    assert created.signing_secret.startswith("whsec_") and created.event_types == EVENTS
    assert created.signing_secret_hint == f"{created.signing_secret[:10]}...{created.signing_secret[-4:]}"

    fetched = sdk.webhooks.retrieve(created.id)
    assert fetched.url == receiver.url and fetched.name == "results"
    assert "signing_secret" not in fetched.model_dump(exclude_none=True)  # shown once, at create

    second = sdk.webhooks.create(name="second", url=receiver.url, event_types=["batch.cancelled"])
    first_page = sdk.webhooks.list(limit=1)
    assert [e.id for e in first_page.data] == [second.id] and first_page.has_more
    assert [e.id for e in sdk.webhooks.list(after=second.id).data] == [created.id]

    updated = sdk.webhooks.update(created.id, name="renamed", event_types=["batch.expired", "batch.expired"])
    assert (updated.name, updated.event_types, updated.url) == ("renamed", ["batch.expired"], receiver.url)

    deleted = sdk.webhooks.delete(created.id)
    assert (deleted.id, deleted.deleted, deleted.object) == (created.id, True, "webhook_endpoint.deleted")
    with pytest.raises(openai.NotFoundError):
        sdk.webhooks.retrieve(created.id)
    assert list(WebhookEndpoint.objects.filter(organization=alice.org).values_list("public_id", flat=True)) == [
        second.id
    ]


def test_the_test_route_sends_a_signed_sample(sdk, receiver, verifier):
    created = sdk.webhooks.create(name="t", url=receiver.url, event_types=EVENTS)
    receiver.statuses = [202]

    result = sdk.webhooks.test(created.id, event_type="batch.failed")

    assert (result.object, result.webhook_endpoint_id, result.event_type) == (
        "webhook_endpoint.test",
        created.id,
        "batch.failed",
    )
    assert (result.status_code, result.success) == (202, True)
    [delivery] = receiver.received
    event = verifier.unwrap(delivery.body, delivery.headers, secret=created.signing_secret)
    assert event.type == "batch.failed" and event.data.id == "batch_test" and event.id.startswith("evt_")
    assert delivery.headers["webhook-id"] == event.id


def test_rotating_the_secret_with_and_without_the_old_one(sdk, receiver, verifier):
    created = sdk.webhooks.create(name="r", url=receiver.url, event_types=EVENTS)
    kept = sdk.webhooks.rotate_secret(created.id, keep_old_secret_active_for_24_hours=True)
    assert kept.signing_secret != created.signing_secret
    sdk.webhooks.test(created.id, event_type="batch.completed")
    both = receiver.received[-1]
    # Signed with both secrets for 24 hours: either verifies.
    for secret in (created.signing_secret, kept.signing_secret):
        verifier.unwrap(both.body, both.headers, secret=secret)

    fresh = sdk.webhooks.rotate_secret(created.id)
    sdk.webhooks.test(created.id, event_type="batch.completed")
    latest = receiver.received[-1]
    verifier.unwrap(latest.body, latest.headers, secret=fresh.signing_secret)
    for stale in (created.signing_secret, kept.signing_secret):
        with pytest.raises(openai.InvalidWebhookSignatureError):
            verifier.unwrap(latest.body, latest.headers, secret=stale)


def test_the_event_types_list(sdk):
    listed = sdk.webhooks.event_types.list()
    assert listed.object == "list"
    assert listed.data == [
        "batch.completed",
        "batch.failed",
        "batch.expired",
        "batch.cancelled",
        "batch.paused",
        "batch.resumed",
        "batch.at_risk",
    ]


@pytest.mark.parametrize(
    "body, param, code",
    [
        ({"url": "https://h.example/x", "event_types": EVENTS}, "name", "missing_required_parameter"),
        ({"name": "n", "event_types": EVENTS}, "url", "missing_required_parameter"),
        ({"name": "n", "url": "https://h.example/x"}, "event_types", "missing_required_parameter"),
        ({"name": "", "url": "https://h.example/x", "event_types": EVENTS}, "name", "invalid_value"),
        ({"name": 5, "url": "https://h.example/x", "event_types": EVENTS}, "name", "invalid_type"),
        ({"name": "n", "url": "ftp://h.example/x", "event_types": EVENTS}, "url", "invalid_url"),
        ({"name": "n", "url": "http://169.254.169.254/latest", "event_types": EVENTS}, "url", "invalid_url"),
        ({"name": "n", "url": "http://127.0.0.1:8000/hook", "event_types": EVENTS}, "url", "invalid_url"),
        ({"name": "n", "url": "https://user:pw@h.example/x", "event_types": EVENTS}, "url", "invalid_url"),
        ({"name": "n", "url": "https://h.example/a\x00b", "event_types": EVENTS}, "url", "invalid_url"),
        ({"name": "n", "url": "https://h.example/a\nb", "event_types": EVENTS}, "url", "invalid_url"),
        ({"name": "n\x00", "url": "https://h.example/x", "event_types": EVENTS}, "name", "invalid_value"),
        ({"name": "n", "url": "https://h.example/x", "event_types": []}, "event_types", "invalid_value"),
        ({"name": "n", "url": "https://h.example/x", "event_types": "batch.completed"}, "event_types", "invalid_type"),
        (
            {"name": "n", "url": "https://h.example/x", "event_types": ["response.completed"]},
            "event_types[0]",
            "invalid_value",
        ),
        (
            {"name": "n", "url": "https://h.example/x", "event_types": EVENTS, "secret": "x"},
            "secret",
            "unknown_parameter",
        ),
    ],
)
def test_create_refusals(alice, body, param, code):
    response = alice.client.post("/v1/webhook_endpoints", body, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["param"], error["code"], error["type"]) == (param, code, "invalid_request_error")
    assert not WebhookEndpoint.objects.exists()


def test_update_rotate_and_test_refusals(alice):
    endpoint = alice.client.post(
        "/v1/webhook_endpoints", {"name": "n", "url": "https://h.example/x", "event_types": EVENTS}, format="json"
    ).json()
    base = f"/v1/webhook_endpoints/{endpoint['id']}"
    for path, body, param in [
        (base, {"url": "http://10.0.0.1/x"}, "url"),
        (base, {"event_types": ["batch.nope"]}, "event_types[0]"),
        (
            f"{base}/rotate_secret",
            {"keep_old_secret_active_for_24_hours": "yes"},
            "keep_old_secret_active_for_24_hours",
        ),
        (f"{base}/test", {}, "event_type"),
        (f"{base}/test", {"event_type": "video.completed"}, "event_type"),
    ]:
        response = alice.client.post(path, body, format="json")
        assert response.status_code == 400, (path, body)
        assert response.json()["error"]["param"] == param
    unchanged = alice.client.get(base).json()
    assert unchanged == {key: value for key, value in endpoint.items() if key != "signing_secret"}


def test_a_test_delivery_that_cannot_connect_is_a_coded_400(alice, settings):
    settings.OPENRELAY_ALLOW_PRIVATE_URLS = True
    endpoint = alice.client.post(
        "/v1/webhook_endpoints", {"name": "n", "url": "http://127.0.0.1:9/hooks", "event_types": EVENTS}, format="json"
    ).json()
    response = alice.client.post(
        f"/v1/webhook_endpoints/{endpoint['id']}/test", {"event_type": "batch.completed"}, format="json"
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "webhook_delivery_failed" and "could not connect" in error["message"]
    assert endpoint["signing_secret"] not in response.content.decode()


def test_another_organizations_endpoints_are_not_found(alice, bob):
    endpoint = alice.client.post(
        "/v1/webhook_endpoints", {"name": "n", "url": "https://h.example/x", "event_types": EVENTS}, format="json"
    ).json()
    base = f"/v1/webhook_endpoints/{endpoint['id']}"
    for response in (
        bob.client.get(base),
        bob.client.post(base, {"name": "mine"}, format="json"),
        bob.client.delete(base),
        bob.client.post(f"{base}/rotate_secret", {}, format="json"),
        bob.client.post(f"{base}/test", {"event_type": "batch.completed"}, format="json"),
    ):
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "webhook_endpoint_not_found"
    assert bob.client.get("/v1/webhook_endpoints").json()["data"] == []
    response = bob.client.get(f"/v1/webhook_endpoints?after={endpoint['id']}")
    assert response.status_code == 404 and response.json()["error"]["param"] == "after"
    assert alice.client.get(base).json()["name"] == "n"
