"""What every scenario of the many-machines tier ends with: `assert_invariants`, and the figures it measures.

- every record exactly once in the output or the error file;
- billed tokens equal across the result lines, the batch and the ledger;
- model calls no more than the records plus the calls not yet saved at the fault (in flight, or answered
  and not yet written: fault_mid_batch's `unsaved`);
- no record stuck (every one finished, none leased);
- a cancel honoured (a second batch, cancelled mid-run, ends cancelled, and no call of it reaches the
  model once the cancel has answered).

`Progress` watches a batch from a thread of its own while a scenario runs its fault: when it finished
and the longest time no record finished after the fault (the time to resume).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tests.hosts.topology import FINISHED_RECORDS, Client, Topology, wait_until

MODEL = "hosts/sim"
TERMINAL = ("completed", "failed", "expired", "cancelled")


def chat_line(i: int, content: str, model: str = MODEL) -> dict[str, Any]:
    return {
        "custom_id": f"req-{i}",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": model, "messages": [{"role": "user", "content": content}]},
    }


def lines(count: int, latency_ms: int, model: str = MODEL, pad: str = "") -> list[dict[str, Any]]:
    return [chat_line(i, f"q {i} {pad}[[latency:{latency_ms}]]", model) for i in range(1, count + 1)]


class Progress:
    """Samples a batch's finished records (completed + failed) every 0.2 s until it ends."""

    def __init__(self, client: Client, batch_id: str):
        self.client, self.batch_id = client, batch_id
        self.samples: list[tuple[float, int]] = []
        self.final: dict[str, Any] | None = None
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"progress-{batch_id}", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                got = self.client.call("GET", f"/v1/batches/{self.batch_id}", timeout=5)
            except Exception:  # noqa: BLE001 - the web may be unreachable mid-fault: no sample then
                got = None
            if got is not None and got.status_code == 200:
                batch = got.json()
                counts = batch["request_counts"]
                self.samples.append((time.monotonic(), counts["completed"] + counts["failed"]))
                if batch["status"] in TERMINAL:
                    self.final = batch
                    return
            self._stop.wait(0.2)

    def finished(self) -> int:
        return self.samples[-1][1] if self.samples else 0

    def wait_finished(self, count: int, timeout: float = 120) -> None:
        wait_until(lambda: self.finished() >= count or self.final, f"{count} records finished", timeout)

    def wait_end(self, timeout: float) -> dict[str, Any]:
        self._thread.join(timeout)
        self._stop.set()
        assert self.final is not None, (
            f"batch {self.batch_id} not finished {timeout} s on; last samples: {self.samples[-5:]}"
        )
        return self.final

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def longest_stall_after(self, moment: float) -> float:
        """The longest time, from `moment` on, during which no record finished."""
        last, stall, count = moment, 0.0, None
        for at, finished in self.samples:
            if at < moment:
                count = finished
                continue
            if count is None or finished > count:
                stall = max(stall, at - last)
                last, count = at, finished
        return round(max(stall, self.samples[-1][0] - last if self.samples else 0.0), 1)

    def done_after(self, moment: float) -> float:
        return round(self.samples[-1][0] - moment, 1)


@dataclass
class Figures:
    """One scenario's figures, for docs/performance.md's recovery table."""

    scenario: str
    records: int
    model_calls: int = 0
    duplicate_calls: int = 0
    in_flight_at_fault: int = 0
    unsaved_at_fault: int = 0
    lost: int = 0
    done_after_fault_s: float = 0.0
    longest_stall_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def publish(self) -> None:
        """Appends to $OPENRELAY_HOSTS_FIGURES (a JSON-lines file) when set; always printed."""
        line = json.dumps(asdict(self))
        print(f"\nhosts figures: {line}")
        if path := os.environ.get("OPENRELAY_HOSTS_FIGURES"):
            with Path(path).open("a") as file:
                file.write(line + "\n")


def assert_invariants(
    hosts: Topology, client: Client, batch: dict[str, Any], total: int, unsaved_at_fault: int, figures: Figures
) -> None:
    """The tier's invariants for `batch` (ended), then a cancel honoured on a fresh one. `unsaved_at_fault`:
    the calls the model had counted at the fault whose records were not finished in the database (0 with
    no fault): the most that may be made twice."""
    settled = calls_settled(hosts)
    calls = settled["total"]
    figures.extra["calls_by_peer"] = settled["by_peer"]
    out, err = client.lines(batch["output_file_id"]), client.lines(batch["error_file_id"])
    ids = [line["custom_id"] for line in out + err]
    expected = {f"req-{i}" for i in range(1, total + 1)}
    figures.model_calls, figures.duplicate_calls = calls, max(0, calls - total)
    figures.lost = len(expected - set(ids))
    figures.publish()
    # Every record exactly once in the output or the error file.
    assert len(ids) == len(set(ids)), f"{len(ids) - len(set(ids))} records twice"
    assert set(ids) == expected, f"missing {sorted(expected - set(ids))[:5]}, extra {sorted(set(ids) - expected)[:5]}"
    assert (batch["request_counts"]["completed"], batch["request_counts"]["failed"]) == (len(out), len(err))
    # Billed tokens equal across the result lines, the batch and the ledger.
    usage = [line["response"]["body"]["usage"] for line in out]
    from_lines = (sum(u["prompt_tokens"] for u in usage), sum(u["completion_tokens"] for u in usage))
    from_batch = (batch["usage"]["input_tokens"], batch["usage"]["output_tokens"]) if batch["usage"] else (0, 0)
    ledger = hosts.sql("SELECT input_tokens, output_tokens FROM billing_ledgerentry WHERE batch_id = %s", batch["id"])
    assert from_lines == from_batch == tuple(ledger[0]), (from_lines, from_batch, ledger)
    # Model calls no more than the records plus those not yet saved at the fault.
    assert calls <= total + unsaved_at_fault, (
        f"{calls} model calls for {total} records, {unsaved_at_fault} not saved at the fault"
    )
    # No record stuck: every one finished and none leased.
    stuck = hosts.sql(
        "SELECT count(*) FROM batches_record r JOIN batches_batch b ON r.batch_id = b.id "
        "WHERE b.public_id = %s AND (r.status <> ALL(%s) OR r.lease_owner IS NOT NULL AND r.lease_owner <> '')",
        batch["id"],
        list(FINISHED_RECORDS),
    )[0][0]
    assert stuck == 0, f"{stuck} records stuck"
    assert_a_cancel_is_honoured(hosts, client)


def calls_settled(hosts: Topology) -> dict[str, Any]:
    """The model's counts once no call has come for half a lease: a host thawed or healed after the batch
    ended sends what it still holds within its next renewal (every quarter lease), so a zombie's calls are
    counted too."""
    window = float(hosts.settings.get("OPENRELAY_LEASE_S", "10")) / 2
    calls, quiet_since = hosts.sim_calls(), time.monotonic()
    deadline = quiet_since + 60
    while time.monotonic() - quiet_since < window:
        assert time.monotonic() < deadline, "model calls never stopped"
        time.sleep(0.25)
        now = hosts.sim_calls()
        if now["total"] != calls["total"]:
            calls, quiet_since = now, time.monotonic()
    return calls


def assert_a_cancel_is_honoured(hosts: Topology, client: Client, count: int = 24) -> None:
    """A batch of slow calls cancelled once its first calls are in flight ends `cancelled` with every record
    once (the unfinished ones as batch_cancelled errors), and no call of it reaches the model once the
    cancel has answered (batches.engine.fence: a cancel answers once no engine may send one)."""
    hosts.sim_reset()
    batch = client.create(lines(count, 1000))
    wait_until(lambda: hosts.sim_calls()["total"] > 0, "the cancelled batch's first calls", 60)
    client.cancel(batch["id"])
    at_answer = hosts.sim_calls()["total"]  # every call that came, those in flight among them
    ended = wait_until(
        lambda: (got := client.batch(batch["id"]))["status"] == "cancelled" and got, "the cancel to end", 60, 0.2
    )
    out, err = client.lines(ended["output_file_id"]), client.lines(ended["error_file_id"])
    assert sorted(line["custom_id"] for line in out + err) == sorted(f"req-{i}" for i in range(1, count + 1))
    assert {line["error"]["code"] for line in err} <= {"batch_cancelled"}
    # Until then, 1 cancel in 5 saw a call after it: an engine that had claimed records ahead learnt of
    # the cancel at its next poll. Counted once no call has come for half a lease (a late one would).
    settled = calls_settled(hosts)["total"]
    assert settled == at_answer, f"{settled - at_answer} model calls of a cancelled batch after its cancel answered"
    assert settled <= count
