"""A deployment is called through the proxy the worker's environment names: a real worker cluster
started with HTTP_PROXY runs a batch on a deployment whose host only the proxy can reach (as an
egress-restricted deployment's hosted model), and one whose NO_PROXY names the model server calls
it directly."""

import asyncio
import threading

import pytest

from openrelay.core.models import Deployment
from tests.engine_tests.test_proxies import Proxy
from tests.helpers import assert_exactly_once, chat, make_batch, status_of, wait_for

RECORDS = 20
# .invalid never resolves (RFC 6761): only the proxy knows where this model server is.
HIDDEN_HOST = "models.egress.invalid"


class ProxyThread:
    """test_proxies.Proxy on its own event loop in a background thread, for processes to use."""

    def __init__(self, **options):
        self.options = options

    def __enter__(self):
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self.thread.start()
        assert ready.wait(10), "the proxy did not start"
        return self.proxy

    def _run(self, ready):
        asyncio.set_event_loop(self.loop)
        self.proxy = self.loop.run_until_complete(Proxy(**self.options).__aenter__())
        ready.set()
        self.loop.run_forever()

    def __exit__(self, *exc):
        asyncio.run_coroutine_threadsafe(self.proxy.__aexit__(None, None, None), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def no_proxies(monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


@pytest.mark.slow
def test_a_worker_cluster_reaches_a_deployment_only_its_proxy_can_reach(alice, model, sim, clusters, no_proxies):
    port = sim.base_url.rsplit(":", 1)[1].split("/")[0]
    Deployment.objects.filter(model=model).update(base_url=f"http://{HIDDEN_HOST}:{port}/v1")
    with ProxyThread(hosts={HIDDEN_HOST: "127.0.0.1"}) as proxy:
        batch = make_batch(alice.org, [chat(f"q {i}") for i in range(RECORDS)])
        clusters(HTTP_PROXY=f"http://127.0.0.1:{proxy.port}")
        wait_for(lambda: status_of(batch) == "completed", 60, "the batch to complete")
        seen = [line for line, _ in list(proxy.seen)]
    out, err = assert_exactly_once(batch, RECORDS)
    assert not err
    # One line a connection (the rest of it is piped): absolute-form requests to the hidden host, the model
    # calls and the adaptive limit's reads of the server's /metrics (batches.engine.calls.flow) alike.
    assert any(line.startswith(f"POST http://{HIDDEN_HOST}:{port}/v1/") for line in seen)
    assert all(
        line.startswith((f"POST http://{HIDDEN_HOST}:{port}/v1/", f"GET http://{HIDDEN_HOST}:{port}/metrics "))
        for line in seen
    ), seen
    assert len(sim.bodies("/v1/chat/completions")) == RECORDS


@pytest.mark.slow
def test_a_worker_cluster_calls_a_no_proxy_host_directly(alice, model, clusters, no_proxies):
    with ProxyThread() as proxy:
        batch = make_batch(alice.org, [chat(f"q {i}") for i in range(RECORDS)])
        clusters(HTTP_PROXY=f"http://127.0.0.1:{proxy.port}", NO_PROXY="localhost,127.0.0.1")
        wait_for(lambda: status_of(batch) == "completed", 60, "the batch to complete")
        seen = list(proxy.seen)
    assert_exactly_once(batch, RECORDS)
    assert seen == []
