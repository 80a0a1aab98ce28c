"""40 webhook /test calls to an endpoint that never answers leave a real web process (uvicorn) live and
other tenants served (issue 42, finding 4: /healthz and every tenant's calls took ~9 s)."""

import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.helpers import database_url, make_persona, wait_for
from webhooks import services

HANG_S = 20  # each test delivery waits this long (OPENRELAY_WEBHOOK_TIMEOUT_S) on the endpoint
PER_ORG = 2  # OPENRELAY_WEBHOOK_TEST_CONCURRENCY's default


def _timed(call):
    started = time.monotonic()
    response = call()
    return response, time.monotonic() - started


def test_forty_hanging_tests_leave_healthz_and_other_tenants_fast(web, hanging, transactional_db):
    alice, bob = make_persona("alice-org"), make_persona("bob-org")
    endpoint, _ = services.create_endpoint(alice.org, name="dead", url=hanging.url, event_types=["batch.completed"])
    process = web(DATABASE_URL=database_url(), OPENRELAY_ALLOW_PRIVATE_URLS="true", OPENRELAY_WEBHOOK_TIMEOUT_S=HANG_S)
    test_url = f"{process.url}/v1/webhook_endpoints/{endpoint.public_id}/test"

    def send_test(_):
        return httpx.post(
            test_url,
            json={"event_type": "batch.completed"},
            headers={"Authorization": f"Bearer {alice.key}"},
            timeout=HANG_S + 30,
        )

    pool = ThreadPoolExecutor(max_workers=40)
    try:
        tests = [pool.submit(send_test, i) for i in range(40)]
        wait_for(lambda: hanging.open >= PER_ORG, 30, "alice's tests to reach the endpoint that hangs")
        # The tests past the bound are answered (429) without waiting on the endpoint.
        wait_for(lambda: sum(f.done() for f in tests) >= 40 - PER_ORG, HANG_S / 2, "the tests past the bound")

        # While alice's tests hang: the probe and another tenant's calls answer at once.
        healthz, healthz_s = max((_timed(lambda: process.get("/healthz")) for _ in range(5)), key=lambda t: t[1])
        bobs, bobs_s = _timed(lambda: process.get("/v1/batches", headers={"Authorization": f"Bearer {bob.key}"}))
        assert healthz.status_code == 200 and healthz_s < 1, healthz_s
        assert bobs.status_code == 200 and bobs_s < 2, bobs_s
        assert hanging.open <= PER_ORG

        answers = [f.result() for f in tests]
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    busy = [r for r in answers if r.status_code == 429]
    assert len(busy) == 40 - PER_ORG
    assert {r.json()["error"]["code"] for r in busy} == {"webhook_tests_busy"}
    assert all(r.headers["retry-after"] == str(HANG_S) for r in busy)
    timed_out = [r for r in answers if r.status_code == 400]
    assert len(timed_out) == PER_ORG
    assert all("timed out" in r.json()["error"]["message"] for r in timed_out)
