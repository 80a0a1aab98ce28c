"""The tokenizer's slots (openrelay.lib.semaphores): one count across processes, none lost to a process
that dies holding one. Redis with REDIS_URL set (a lease), file locks under the data dir without (the
kernel frees a dead process's locks)."""

import textwrap
import time

import pytest
from django.conf import settings

from openrelay.lib import semaphores
from tests.helpers import wait_for
from tests.processes import start

# Long enough that the child's slots are still leased when this process first looks, on a loaded
# machine (1 s failed once under CI-like load: the child's lease ran out before the first look).
LEASE_S = 5.0

HOLDER = textwrap.dedent(
    """
    import sys, time, django
    django.setup()
    from openrelay.lib import semaphores
    gate = semaphores.shared(sys.argv[1], 2, lease_s=float(sys.argv[2]))
    held = [gate.acquire(5.0) for _ in range(2)]
    print("held", all(held), flush=True)
    time.sleep(600)
    """
)


def test_it_never_gives_more_slots_than_its_limit():
    gate = semaphores.shared(f"limit-{time.monotonic_ns()}", 3, lease_s=30)
    held = [gate.acquire(0.5) for _ in range(3)]
    assert all(held)
    started = time.monotonic()
    assert gate.acquire(0.2) is None
    assert 0.2 <= time.monotonic() - started < 5  # its wait, then no slot (the bound: a loaded machine)
    held.pop().release()
    assert gate.acquire(0.2) is not None


def test_a_process_that_dies_holding_slots_gives_them_back(db):
    name = f"dying-{time.monotonic_ns()}"
    gate = semaphores.shared(name, 2, lease_s=LEASE_S)
    holder = start(
        "slot-holder",
        ["-c", HOLDER, name, str(LEASE_S)],
        settings.DATA_DIR,
        DJANGO_SETTINGS_MODULE="openrelay.settings",
    )
    try:
        wait_for(lambda: "held" in holder.log_tail(), 30, "the child to hold its slots")
        assert "held True" in holder.log_tail()
        assert gate.acquire(0.2) is None  # the other process's slots count here
        holder.kill()
        killed = time.monotonic()
        freed = []  # the slot the dead process held, once this process gets it
        wait_for(lambda: freed.append(gate.acquire(0.05)) or freed[-1], 10, "a dead process's slot to come back")
        slot = freed[-1]
        back_after = time.monotonic() - killed
    finally:
        holder.stop()
    slot.release()
    print(f"slot back {back_after:.3f} s after the kill")
    # Without a lease or the kernel's unlock it would never come back. File locks: once the process is
    # reaped (kill() waits for it); Redis: within the lease (plus a loaded machine's margin).
    assert back_after < (LEASE_S + 3 if settings.REDIS_URL else 1)


@pytest.mark.parametrize("limit", [0, -1])
def test_a_limit_under_one_is_one(limit):
    gate = semaphores.shared(f"one-{time.monotonic_ns()}", limit, lease_s=30)
    first = gate.acquire(0.1)
    assert first is not None and gate.acquire(0.1) is None
    first.release()
