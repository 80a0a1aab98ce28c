"""The outbound guard on the engine path: user URLs (tool executors, MCP servers,
workflow callbacks) whose host is, or resolves to, a blocked address are
refused inside a real batch run, the servers behind them never see a byte, and
the record's error names neither the address nor the URL's path or query.

tests/outbound_tests covers the guard module itself; this covers the wiring:
every loop really goes through it, with the setting read as deployed.
"""

import re
import socket

import aiohttp
import pytest

from batches.engine.runner import run_batch
from batches.models import Batch
from openrelay.core.models import Deployment, Model
from openrelay.simulator.config import SimulatorConfig
from openrelay.simulator.server import run_in_thread
from tests.helpers import MODEL, make_batch, read_lines

BLOCKED = re.compile(r"blocked|private, loopback|not allowed")
TOOL = {
    "type": "function",
    "function": {"name": "lookup", "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}},
}

# Names the test resolver answers (everything else resolves for real).
FAKE_DNS = {
    "metadata.example.test": ["169.254.169.254"],
    "ec2-v6.example.test": ["fd00:ec2::254"],
    "mapped.example.test": ["::ffff:10.1.2.3"],
    "cgnat.example.test": ["100.64.0.7"],
    "rfc1918.example.test": ["192.168.1.10"],
    "public-and-private.example.test": ["93.184.216.34", "10.0.0.8"],
}


@pytest.fixture
def fake_dns(monkeypatch):
    real = aiohttp.ThreadedResolver.resolve

    async def resolve(self, host, port=0, family=socket.AF_INET):
        if host not in FAKE_DNS:
            return await real(self, host, port, family)
        return [
            {
                "hostname": host,
                "host": ip,
                "port": port,
                "proto": 0,
                "flags": socket.AI_NUMERICHOST,
                "family": socket.AF_INET6 if ":" in ip else socket.AF_INET,
            }
            for ip in FAKE_DNS[host]
        ]

    monkeypatch.setattr(aiohttp.ThreadedResolver, "resolve", resolve)


@pytest.fixture
def guarded(settings, transactional_db, alice):
    settings.OPENRELAY_ALLOW_PRIVATE_URLS = False  # as deployed
    alice.org.workflows_enabled = True
    alice.org.save()
    with run_in_thread(SimulatorConfig()) as sim:
        # The model deployment is operator configuration, not a user URL: it may be on loopback.
        model = Model.objects.create(name=MODEL)
        Deployment.objects.create(model=model, base_url=sim.base_url, upstream_model="sim-upstream")
        yield sim


def tool_body(url, kind="http"):
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Look it up."}],
        "tools": [TOOL],
        "openrelay": {"tool_config": {"type": kind, "url": url, "authorization": "Bearer s3cret-token"}},
    }


def workflow_body(url):
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Plan it."}],
        "openrelay": {"workflow": {"url": url, "authorization": "Bearer s3cret-token"}},
    }


def _urls(executor, callback, mcp):
    """(label, body, expected error code, address that must not be echoed)."""
    tool_port, callback_port = executor.port, callback.port
    mcp_port = mcp.url.rsplit(":", 1)[1].split("/")[0]
    cases = [
        (
            "localhost name -> tool",
            tool_body(f"http://localhost:{tool_port}/tools?key=q1"),
            "tool_execution_failed",
            "127.0.0.1",
        ),
        ("loopback literal -> tool", tool_body(f"http://127.0.0.1:{tool_port}/tools"), "tool_execution_failed", None),
        (
            "mapped v6 literal -> tool",
            tool_body(f"http://[::ffff:127.0.0.1]:{tool_port}/tools"),
            "tool_execution_failed",
            None,
        ),
        (
            "localhost name -> mcp",
            tool_body(f"http://localhost:{mcp_port}/mcp", "mcp"),
            "tool_execution_failed",
            "127.0.0.1",
        ),
        (
            "localhost name -> workflow",
            workflow_body(f"http://localhost:{callback_port}/workflow"),
            "workflow_callback_failed",
            "127.0.0.1",
        ),
        (
            "metadata literal -> tool",
            tool_body("http://169.254.169.254/latest/meta-data/"),
            "tool_execution_failed",
            None,
        ),
        ("metadata v6 literal -> mcp", tool_body("http://[fd00:ec2::254]/mcp", "mcp"), "tool_execution_failed", None),
    ]
    for host, addresses in FAKE_DNS.items():
        for label, body, code in (
            ("tool", tool_body(f"http://{host}/tools"), "tool_execution_failed"),
            ("mcp", tool_body(f"http://{host}/mcp", "mcp"), "tool_execution_failed"),
            ("workflow", workflow_body(f"http://{host}/workflow"), "workflow_callback_failed"),
        ):
            cases.append((f"{host} -> {label}", body, code, addresses[-1]))
    return cases


def test_blocked_user_urls_never_reach_their_servers(alice, guarded, fake_dns, executor, callback, auth_server):
    cases = _urls(executor, callback, auth_server)
    batch = make_batch(alice.org, [body for _, body, _, _ in cases])
    run_batch(batch.pk)
    batch = Batch.objects.get(pk=batch.pk)
    assert batch.status == "completed"
    assert read_lines(batch.output_file) == []
    errors = {line["custom_id"]: line for line in read_lines(batch.error_file)}
    assert len(errors) == len(cases)
    for index, (label, _, code, address) in enumerate(cases, start=1):
        error = errors[f"req-{index}"]["error"]
        assert error["code"] == code, (label, error)
        assert BLOCKED.search(error["message"]), (label, error["message"])
        if address:  # a resolved name: the internal address stays unsaid
            assert address not in error["message"], (label, error["message"])
        assert "s3cret-token" not in error["message"] and "key=q1" not in error["message"]
    # Not one request reached the executor, the callback or the MCP server.
    assert executor.received == [] and callback.calls == [] and auth_server.seen == []


def test_the_same_servers_are_reached_when_private_urls_are_allowed(alice, guarded, settings, executor, callback):
    settings.OPENRELAY_ALLOW_PRIVATE_URLS = True  # local development and tests
    callback.answer(lambda payload: {"status": "completed", "output": {"ok": True}})
    batch = make_batch(
        alice.org,
        [
            tool_body(f"http://localhost:{executor.port}/tools"),
            workflow_body(f"http://localhost:{callback.port}/workflow"),
        ],
    )
    run_batch(batch.pk)
    batch = Batch.objects.get(pk=batch.pk)
    assert (batch.completed_count, batch.failed_count) == (2, 0), read_lines(batch.error_file)
    assert len(executor.received) == 1 and len(callback.calls) == 1
