"""Faults across hosts, each ending with the tier's invariants (invariants.assert_invariants).

One topology for the module (tests/hosts/conftest.py): db, redis, s3, web, model, and two worker hosts
each running compose.yaml's `worker` (qcluster, its default workers). Each scenario starts healed, runs
a batch of slow calls (so it is mid-run at the fault), faults a host at a quarter of it, and checks.
Leases are 4 s (conftest.SETTINGS), so every bound below is a few leases.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import signal
import threading
import time

import httpx
import pytest

from tests.hosts.invariants import MODEL, Figures, Progress, assert_invariants, calls_settled, lines
from tests.hosts.topology import WORKERS, Client, wait_until

# The first test also builds the topology (initdb, migrate, five hosts' processes: about 2 minutes on a
# loaded 2-core machine), which pytest-timeout counts as that test's: 10 minutes, not the suite's 5.
pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.timeout(600)]

RECORDS = 200
LATENCY_MS = 1000
CONCURRENCY = 32
LEASE_S = 4.0
NARROW_MODEL, NARROW = "hosts/narrow", 6
# How long a scenario's batch may take after its fault: the batch's own run (about 12 s) and a few leases.
DONE_WITHIN_S = 90


@pytest.fixture(scope="module")
def client(topology):
    """An organization of its own and the model, deployed on the model host (as an operator would)."""
    prices = ["--input-price", "1", "--output-price", "2"]
    served = ["--base-url", topology.model_url + "/v1", "--upstream-model", "sim-upstream"]
    # As an operator would, on the web host: an organization, the model, and the same server as another
    # model whose one deployment allows NARROW calls at once. Side by side: each command starts Django.
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        org = pool.submit(topology.manage, "create_org", "hosts")
        done = [
            pool.submit(topology.manage, "set_model", MODEL, *served, "--concurrency", str(CONCURRENCY), *prices),
            pool.submit(topology.manage, "set_model", NARROW_MODEL, *served, "--concurrency", str(NARROW)),
        ]
        key = org.result().strip().splitlines()[-1]
        for command in done:
            command.result()
    wait_until(lambda: topology.engines() == 4, "both worker hosts' 4 engines", 120)
    return Client(topology, key)


def fault_mid_batch(hosts, client, name, strike, hold=None, *, records=RECORDS, latency_ms=LATENCY_MS, busy=None):
    """Runs a batch, faults it once a quarter of it has finished (and the `busy` host has calls in flight:
    the fault then catches it holding records), waits for the end, checks.

    The fault is `strike()`, the moment it happens (a link cut, a process stopped), then `hold()`, what
    goes on until it ends (a sleep, a restart: its measurements). Returns the batch ended, what the model
    saw at the fault, and the figures. `at_fault["unsaved"]` is the calls that may be made twice: those
    the model had counted just after the strike less the records the database held finished just before
    it. A call in flight is one of them, and so is one answered whose result the engine had not yet
    written (its trips group results for FLUSH_EVERY_S): a host cut then made 26 calls twice with 16 in
    flight."""
    batch = client.create(lines(records, latency_ms))
    progress = Progress(client, batch["id"])
    try:
        progress.wait_finished(records // 4, timeout=120)
        if busy:
            address = hosts.address[busy]
            wait_until(lambda: hosts.sim_calls()["in_flight_by_peer"].get(address, 0) >= 4, f"{busy} calling", 60, 0.05)
        finished = hosts.finished_records(batch["id"])  # read first: a later read could only lower the bound
        moment = time.monotonic()
        strike()
        at_fault = hosts.sim_calls()
        at_fault["unsaved"] = at_fault["total"] - finished
        measured = hold() if hold else None
        ended = progress.wait_end(DONE_WITHIN_S)
    finally:
        progress.stop()
    figures = Figures(
        name,
        records,
        in_flight_at_fault=at_fault["in_flight"],
        unsaved_at_fault=at_fault["unsaved"],
        done_after_fault_s=progress.done_after(moment),
        longest_stall_s=progress.longest_stall_after(moment),
        extra={"status": ended["status"], **(measured or {})},
    )
    return ended, at_fault, figures


def assert_done_within_two_leases(figures, own_run_s):
    """Issue 54: no batch frozen by another host's loss, done within 2 leases and its own run time."""
    bound = round(2 * LEASE_S + own_run_s, 1)
    assert figures.done_after_fault_s <= bound, f"done {figures.done_after_fault_s} s after the fault, over {bound} s"


def fenced_within(hosts, host, limit_s):
    """Seconds until no engine row of `host` is left (the others fenced it), polled up to `limit_s`; None if
    some were left then."""
    started = time.monotonic()
    while hosts.engines_of(host):
        if time.monotonic() - started >= limit_s:
            return None
        time.sleep(0.1)
    return round(time.monotonic() - started, 1)


@pytest.fixture(scope="module")
def own_run_s(topology, client):
    """The batch with no fault, once a module: its invariants, and its own run time (create to end), which
    the faults' bounds add to."""
    topology.heal()
    topology.sim_reset()
    started = time.monotonic()
    ended, _, figures = fault_mid_batch(topology, client, "no fault", lambda: None)
    run_s = round(time.monotonic() - started, 1)
    figures.extra["own_run_s"] = run_s
    assert ended["status"] == "completed"
    assert_invariants(topology, client, ended, RECORDS, 0, figures)  # no fault: no call made twice
    return run_s


def test_no_fault_baseline(hosts, own_run_s):
    """The same batch with no fault: what the others' figures compare with (own_run_s runs and checks it)."""
    assert 0 < own_run_s < DONE_WITHIN_S


def test_node_loss_work1_link_cut_mid_batch(hosts, client, own_run_s):
    """work1's link goes down (no FIN, no RST): work2 takes its records over and finishes the batch."""

    def cut():
        hosts.network.cut("work1")

    ended, at_fault, figures = fault_mid_batch(hosts, client, "node loss (work1's link down)", cut, busy="work1")
    hosts.network.heal("work1")
    assert ended["status"] == "completed"
    assert_invariants(hosts, client, ended, RECORDS, at_fault["unsaved"], figures)
    assert_done_within_two_leases(figures, own_run_s)


def test_partition_work1_cut_from_db_only_stops_calling_the_model(hosts, client, own_run_s):
    """work1 loses the database but still reaches the model: once its leases run out (a lease after the
    cut at most) it must send no more calls (a zombie must not burn inference); its calls are counted by
    its address. It starts no record after the cut either: a record's first call waits for its sent mark
    to land on the database (batches.engine.trips.SentMarks), so the only calls made twice are those in
    flight at the cut (issue 54's goal)."""
    work1 = hosts.address["work1"]
    seen = {}

    def partition():
        hosts.network.drop_between("work1", "db")
        seen["at_cut"] = hosts.sim_calls()["by_peer"].get(work1, 0)

    def go_on():
        time.sleep(LEASE_S)  # the fault goes on: within this lease its calls may still be its own
        seen["lease_later"] = hosts.sim_calls()["by_peer"].get(work1, 0)

    try:
        ended, at_fault, figures = fault_mid_batch(
            hosts, client, "partition (work1 cut from db)", partition, go_on, busy="work1"
        )
        at_end = calls_settled(hosts)["by_peer"].get(work1, 0)
        figures.extra["work1_calls_after_cut"] = at_end - seen["at_cut"]
        after_lease = figures.extra["work1_calls_a_lease_after_cut"] = at_end - seen["lease_later"]
    finally:
        hosts.network.undrop("work1")
    assert ended["status"] == "completed"
    try:
        assert after_lease == 0, f"work1 made {after_lease} model calls more than a lease after it lost the database"
    finally:
        assert_invariants(hosts, client, ended, RECORDS, at_fault["unsaved"], figures)
    assert_done_within_two_leases(figures, own_run_s)


def test_paused_host_sigstop_then_sigcont(hosts, client, own_run_s):
    """work1 stopped (SIGSTOP to its whole cluster) for 3 leases, then continued: work2 takes its records
    when their leases lapse; the thawed host must not send them again."""
    pause_s = 3 * LEASE_S
    work1 = hosts.address["work1"]
    seen = {}

    def pause():
        seen["paused"] = time.monotonic()
        hosts.pause("work1")

    def stay_paused():
        started = seen["paused"]
        fenced_s = fenced_within(hosts, "work1", pause_s)
        time.sleep(max(0.0, pause_s - (time.monotonic() - started)))  # the fault itself
        seen["at_thaw"] = hosts.sim_calls()["by_peer"].get(work1, 0)
        hosts.resume("work1")
        return {"paused_s": pause_s, "fenced_s": fenced_s}

    ended, at_fault, figures = fault_mid_batch(
        hosts, client, f"paused host (SIGSTOP {pause_s:g} s)", pause, stay_paused, busy="work1"
    )
    after_thaw = calls_settled(hosts)["by_peer"].get(work1, 0) - seen["at_thaw"]
    figures.extra["work1_calls_after_thaw"] = after_thaw
    assert ended["status"] == "completed"
    try:
        # Its leases ran out while it was stopped: whatever it held is another host's now.
        assert after_thaw == 0, f"work1 made {after_thaw} model calls after SIGCONT, its leases long gone"
    finally:
        assert_invariants(hosts, client, ended, RECORDS, at_fault["unsaved"], figures)
    fenced_s = figures.extra["fenced_s"]
    assert fenced_s is not None and fenced_s <= 2 * LEASE_S, f"work1 paused, fenced after {fenced_s} s"
    assert_done_within_two_leases(figures, own_run_s)


def test_db_restarted_mid_batch(hosts, client):
    """PostgreSQL stopped (fast shutdown: every session cut) and started again mid-batch."""

    stopped = {}

    def stop():
        stopped["at"] = time.monotonic()
        hosts.stop_db()

    def start():
        hosts.start_db()
        return {"db_down_s": round(time.monotonic() - stopped["at"], 1)}

    ended, at_fault, figures = fault_mid_batch(hosts, client, "db restarted", stop, start)
    assert ended["status"] == "completed"
    assert_invariants(hosts, client, ended, RECORDS, at_fault["unsaved"], figures)


def test_redis_down_30_s(hosts, client):
    """Redis (the broker and the Channels layer) killed for 30 s: the records live in PostgreSQL, so the
    engines go on; the batch completes and nothing is counted twice."""

    def outage():
        time.sleep(30)  # the fault itself
        hosts.start_redis()
        return {"redis_down_s": 30}

    ended, at_fault, figures = fault_mid_batch(
        hosts,
        client,
        "redis down 30 s",
        lambda: hosts.processes.pop("redis").stop(),
        outage,
        records=2 * RECORDS,
        latency_ms=3 * LATENCY_MS,
    )
    assert ended["status"] == "completed"
    assert_invariants(hosts, client, ended, 2 * RECORDS, at_fault["unsaved"], figures)


def test_s3_down_30_s(hosts, client):
    """The s3 host's link down for 30 s mid-batch (no FIN, no RST): the engines can read no input line and
    write no result file until it is back. Once it is, the batch completes: every record once, none
    failed for it, nothing stuck, and its files written (the invariants read them back from the bucket)."""
    down_s = 30

    def outage():
        time.sleep(down_s)  # the fault itself
        hosts.network.heal("s3")
        return {"s3_down_s": down_s}

    ended, at_fault, figures = fault_mid_batch(
        hosts, client, f"s3 down {down_s} s", lambda: hosts.network.cut("s3"), outage
    )
    assert ended["status"] == "completed"
    assert ended["request_counts"]["failed"] == 0, ended["request_counts"]
    assert_invariants(hosts, client, ended, RECORDS, at_fault["unsaved"], figures)


def test_max_concurrency_held_across_both_worker_hosts(hosts, client):
    """A deployment's max_concurrency is one limit for every engine on every host: the most calls in flight
    at the model never pass it, and both hosts call."""
    limit = NARROW
    ended = Progress(client, client.create(lines(96, 400, model=NARROW_MODEL))["id"]).wait_end(120)
    calls = hosts.sim_calls()
    figures = Figures(f"max_concurrency {limit} across 2 hosts", 96, extra={"max_in_flight": calls["max_in_flight"]})
    figures.extra["calls_by_host"] = {host: calls["by_peer"].get(hosts.address[host], 0) for host in ("work1", "work2")}
    assert calls["max_in_flight"] <= limit, calls
    assert all(figures.extra["calls_by_host"].values()), figures.extra
    assert_invariants(hosts, client, ended, 96, 0, figures)


def test_web_lost_mid_upload_then_the_retry_with_the_same_idempotency_key(hosts, client):
    """The web host's process killed while a 4 MB upload streams in; it comes back; the client retries the
    upload and the create with the same Idempotency-Keys: one file, one batch, every record once."""
    records = 120
    body_lines = lines(records, 300, pad="x" * 32_000)
    raw = b"".join(__import__("orjson").dumps(line) + b"\n" for line in body_lines)
    boundary = "hosts-upload-boundary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    tail = f"\r\n--{boundary}--\r\n".encode()
    headers = {
        **client.headers,
        "Content-Type": f"multipart/form-data; boundary={boundary}",
        "Content-Length": str(len(head) + len(raw) + len(tail)),
        "Idempotency-Key": "hosts-upload-1",
    }
    killed = threading.Event()

    def body():
        yield head
        for offset in range(0, len(raw), 64 * 1024):
            if offset >= len(raw) // 2 and not killed.is_set():
                hosts.processes["web"].stop()  # SIGKILL mid-upload: no answer, the connection reset
                killed.set()
            yield raw[offset : offset + 64 * 1024]
        yield tail

    def first_try():
        with contextlib.suppress(httpx.HTTPError):
            return httpx.post(hosts.web_url + "/v1/files", content=body(), headers=headers, timeout=30)

    lost = hosts.ops(first_try)
    assert killed.is_set() and lost is None, lost
    started = time.monotonic()
    hosts.start_web()
    back_s = round(time.monotonic() - started, 1)
    retried = client.upload(body_lines, idempotency_key="hosts-upload-1")
    assert retried.status_code == 200, retried.text
    again = client.upload(body_lines, idempotency_key="hosts-upload-1")
    assert again.status_code == 200 and again.json()["id"] == retried.json()["id"], again.text
    create = {"input_file_id": retried.json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    made = [
        client.call("POST", "/v1/batches", json=create, headers={"Idempotency-Key": "hosts-create-1"}) for _ in "12"
    ]
    assert [m.status_code for m in made] == [200, 200] and made[0].json()["id"] == made[1].json()["id"], made[1].text
    ended = Progress(client, made[0].json()["id"]).wait_end(120)
    figures = Figures("web lost mid-upload, retried with Idempotency-Key", records, extra={"web_back_s": back_s})
    assert ended["status"] == "completed"
    assert_invariants(hosts, client, ended, records, 0, figures)


def test_rolling_deploy_old_and_new_workers_together(hosts, client):
    """A rolling deploy as many-machines.md tells an operator to run one: the new migrations applied first
    (the module's topology migrated with this checkout's), then the processes rolled one host at a time.
    Both worker hosts run the previous release (Topology.previous_release: the product one schema change
    ago) when the batch starts, and a web of the previous release (on work2's machine) takes a batch too
    (a web replica not rolled yet); mid-batch work1 is rolled to this checkout (SIGTERM: it hands its
    records back within the stop grace, then the new one starts) while work2's old one runs on to the
    end: old and new engines share the batches, on the new schema. Then work2 is rolled too.

    The previous release inserts rows without the columns the new migrations added: each needs a
    database default (tests/test_migrations_compat.py); with only Django's `default=` the old web's
    create failed (NOT NULL violation)."""
    previous = hosts.previous_release()
    for host in WORKERS:
        hosts.processes.pop(host).stop(signal.SIGTERM, timeout=45)
        hosts.start_worker(host, previous)
    argv, env = hosts.product("web", "work2", previous)
    hosts.run("work2", "old-web", argv, {**env, "ALLOWED_HOSTS": hosts.address["work2"]}, previous)

    rolled = {}

    def stop_work1():  # the strike: SIGTERM, and the wait for its records handed back
        rolled["at"] = time.monotonic()
        hosts.processes.pop("work1").stop(signal.SIGTERM, timeout=45)

    def start_work1():
        hosts.start_worker("work1")
        return {"work1_replaced_s": round(time.monotonic() - rolled["at"], 1)}

    try:
        for host in WORKERS:
            wait_until(lambda: len(hosts.engines_of(host)) == 2, f"{host}'s old engines", 120)  # noqa: B023
        hosts.wait_listening("old-web", 8000, 120)
        old_web = Client(hosts, client.headers["Authorization"].split()[-1], f"http://{hosts.address['work2']}:8000")
        ended_old = Progress(client, old_web.create(lines(24, 300))["id"]).wait_end(60)
        hosts.sim_reset()  # its calls are not the next batch's
        ended, at_fault, figures = fault_mid_batch(
            hosts,
            client,
            "rolling deploy (work2 and a web old, work1 rolled to new)",
            stop_work1,
            start_work1,
            busy="work1",
        )
        old_still = hosts.processes["work2"].release == previous and hosts.processes["work2"].running()
    finally:
        hosts.processes.pop("old-web").stop()
        hosts.processes.pop("work2").stop(signal.SIGTERM, timeout=45)
        hosts.start_worker("work2")
    assert old_still, "work2's previous release did not run to the batch's end"
    assert (ended["status"], ended_old["status"]) == ("completed", "completed")
    assert ended_old["request_counts"]["completed"] == 24, ended_old["request_counts"]
    assert_invariants(hosts, client, ended, RECORDS, at_fault["unsaved"], figures)
