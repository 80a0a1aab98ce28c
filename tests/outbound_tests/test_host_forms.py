"""Host forms the guard refuses whatever they resolve to, everywhere a user URL is taken (issue 42):

- brackets holding no IPv6 literal (`http://[name:with.colon]/`): aiohttp took the host for an address
  literal and skipped the guarded resolver, and a hosts-file entry for the name reached loopback with
  the guard on (finding 5); refused in the one blocked-host message;
- a label `xn--` that is not valid punycode: a 500 at the webhook route and `internal_error` records
  (finding 6); a coded 400, and a coded rejection at create.
"""

import asyncio
import socket

import pytest

from batches.engine.tools.base import ToolExecutionFailed
from batches.engine.tools.http_executor import HttpExecutor
from batches.engine.tools.mcp import McpExecutor
from batches.validation.extensions import RecordRejected, normalize_tool_config, normalize_workflow
from openrelay.lib.outbound import HOST_REFUSED, OutboundClient, OutboundError, check_url
from webhooks import services
from webhooks.models import DeliveryStatus, WebhookDelivery, WebhookEndpoint

NAME = "name:with.colon"
BRACKETED = [f"http://[{NAME}]/hooks", "http://[localhost:80]/", "https://[evil.example:1]:8443/x"]
BAD_IDNA = ["https://xn--zz.example/hooks", "http://xn--a.com/"]


@pytest.fixture
def hosts_entry(monkeypatch, receiver):
    """The name maps to loopback, as the red team's hosts-file entry did (a shared machine's /etc/hosts
    is not a test's to edit; getaddrinfo is where that entry is read). aiohttp asks for an IPv6 answer
    (it took the host for an IPv6 literal), so the entry is ::ffff:127.0.0.1, which reaches the
    receiver on 127.0.0.1, standing in for an internal service."""
    real = socket.getaddrinfo

    def getaddrinfo(host, *args, **kwargs):
        return real("::ffff:127.0.0.1" if host == NAME else host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return f"http://[{NAME}]:{receiver.url.rsplit(':', 1)[1]}"


@pytest.fixture
def guard_on(settings, receiver):
    settings.OPENRELAY_ALLOW_PRIVATE_URLS = False  # the receiver fixture turns it off; the guard is the subject


def _refused_reason(message):
    return message.rsplit(": ", 1)[-1].rstrip(".")


def test_the_outbound_client_refuses_it_and_never_reaches_loopback(hosts_entry, receiver, guard_on):
    async def post():
        async with OutboundClient(allow_private=False) as client:
            await client.post_json(hosts_entry, {}, timeout_s=5)

    with pytest.raises(OutboundError) as caught:
        asyncio.run(post())
    assert (caught.value.kind, _refused_reason(caught.value.message)) == ("blocked", HOST_REFUSED)
    assert receiver.received == []


@pytest.mark.parametrize("allow_private", [False, True])
@pytest.mark.parametrize("url", BRACKETED)
def test_check_url_refuses_brackets_without_an_ipv6_literal(url, allow_private):
    with pytest.raises(OutboundError) as caught:
        check_url(url, allow_private=allow_private)
    assert _refused_reason(caught.value.message) == HOST_REFUSED


def test_real_ipv6_literals_still_pass():
    assert check_url("http://[2606:4700::1111]/", allow_private=False).host == "2606:4700::1111"


# --- webhook endpoints ----------------------------------------------------------------------


@pytest.mark.parametrize("url", BRACKETED)
def test_webhook_create_and_update_refuse_it(alice, guard_on, url):
    created = alice.client.post(
        "/v1/webhook_endpoints", {"name": "h", "url": url, "event_types": ["batch.completed"]}, format="json"
    )
    assert created.status_code == 400
    assert created.json()["error"]["code"] == "invalid_url"
    assert _refused_reason(created.json()["error"]["message"]) == HOST_REFUSED
    endpoint, _ = services.create_endpoint(
        alice.org, name="h", url="https://hooks.example/", event_types=["batch.completed"]
    )
    updated = alice.client.post(f"/v1/webhook_endpoints/{endpoint.public_id}", {"url": url}, format="json")
    assert updated.status_code == 400 and updated.json()["error"]["code"] == "invalid_url"


def _stored_before_the_fix(org, url):
    # An endpoint saved while the guard let this form through: delivery and /test must refuse it too.
    endpoint, _ = services.create_endpoint(org, name="old", url="https://hooks.example/", event_types=["batch.failed"])
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(url=url)
    endpoint.refresh_from_db()
    return endpoint


def test_webhook_test_refuses_it_and_reports_no_internal_status(alice, hosts_entry, receiver, guard_on):
    endpoint = _stored_before_the_fix(alice.org, f"{hosts_entry}/hooks")
    response = alice.client.post(
        f"/v1/webhook_endpoints/{endpoint.public_id}/test", {"event_type": "batch.failed"}, format="json"
    )
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "webhook_delivery_failed" and _refused_reason(error["message"]) == HOST_REFUSED
    assert receiver.received == []


def test_a_delivery_refuses_it(alice, hosts_entry, receiver, guard_on):
    endpoint = _stored_before_the_fix(alice.org, f"{hosts_entry}/hooks")
    delivery = WebhookDelivery.objects.create(endpoint=endpoint, event_type="batch.failed", payload="{}")
    assert services.deliver_pk(delivery.pk) == DeliveryStatus.PENDING  # to be retried, refused again
    delivery.refresh_from_db()
    assert delivery.last_status_code is None and _refused_reason(delivery.last_error) == HOST_REFUSED
    assert receiver.received == []


# --- tool executors, MCP servers, workflow callbacks ----------------------------------------

CREATE_CHECKS = [
    pytest.param(lambda url: normalize_tool_config({"url": url}), "invalid_tool_config", id="tool-executor"),
    pytest.param(lambda url: normalize_tool_config({"type": "mcp", "url": url}), "invalid_tool_config", id="mcp"),
    pytest.param(lambda url: normalize_workflow({"url": url}), "invalid_workflow", id="workflow"),
]


@pytest.mark.parametrize("url", [*BRACKETED, *BAD_IDNA])
@pytest.mark.parametrize(("check", "code"), CREATE_CHECKS)
def test_create_rejects_it_with_a_code(check, code, url):
    with pytest.raises(RecordRejected) as caught:
        check(url)
    assert caught.value.code == code and caught.value.param.endswith(".url")
    if url in BRACKETED:
        assert _refused_reason(caught.value.message) == HOST_REFUSED
    else:
        assert "IDNA" in caught.value.message


@pytest.mark.parametrize("executor", [HttpExecutor, McpExecutor], ids=["tool-executor", "mcp"])
def test_executors_refuse_it_when_called(executor, hosts_entry, receiver):
    async def call():
        async with OutboundClient(allow_private=False) as outbound:
            await executor(outbound, "r", {"url": f"{hosts_entry}/tools", "timeout_ms": 5000}).execute(
                [{"id": "c", "function": {"name": "f", "arguments": "{}"}}]
            )

    with pytest.raises(ToolExecutionFailed) as caught:
        asyncio.run(call())
    assert HOST_REFUSED in str(caught.value)
    assert receiver.received == []


# --- invalid IDNA ---------------------------------------------------------------------------


@pytest.mark.parametrize("url", BAD_IDNA)
def test_an_invalid_idna_host_is_a_coded_400_at_the_webhook_route(alice, url):
    response = alice.client.post(
        "/v1/webhook_endpoints", {"name": "h", "url": url, "event_types": ["batch.completed"]}, format="json"
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["code"], error["param"], error["type"]) == ("invalid_url", "url", "invalid_request_error")
    assert "IDNA" in error["message"]


@pytest.mark.parametrize("url", BAD_IDNA)
def test_an_invalid_idna_host_is_refused_by_the_client_not_an_internal_error(url):
    async def post():
        async with OutboundClient(allow_private=True) as client:
            await client.post_json(url, {}, timeout_s=5)

    with pytest.raises(OutboundError) as caught:
        asyncio.run(post())
    assert caught.value.kind == "blocked"
