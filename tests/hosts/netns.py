"""Hosts in Linux network namespaces: made by the test, one bridge between them, nothing routed out.

`Network(prefix)` makes a namespace `<prefix>-net` holding the bridge `br0`, and for each host a
namespace `<prefix>-<host>` whose `eth0` is one end of a veth pair, the other end (named after the host)
a port of the bridge. The pair is made with both ends already inside their namespaces, so no link ever
exists in the machine's own namespace. Addresses are from 198.18.0.0/15 (RFC 2544, set aside for network
tests); no namespace has a default route, so nothing leaves them.

Faults: `cut(host)` takes the host's bridge port down (its peers see silence: no FIN, no RST),
`heal(host)` brings it back; `drop_between(host, peer)` drops everything between two hosts in the
host's own namespace (an nftables table), `undrop(host)` removes it.

The prefix carries the pid of the run that made it (`orh<pid>`): `sweep()` removes what a run that died
left (its processes killed, its namespaces deleted), never a live run's. `remove()` is idempotent and is
called however the run ends.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Callable
from typing import Any

NETWORK = "198.18.0"  # a /24 of 198.18.0.0/15
PREFIX_PATTERN = re.compile(r"^orh(\d+)-")
CLONE_NEWNET = 0x40000000
CUT_TABLE = "openrelay_cut"


class NamespacesUnavailable(RuntimeError):
    """This machine (or this user) cannot make network namespaces."""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=30)


def run_prefix(pid: int | None = None) -> str:
    return f"orh{pid or os.getpid()}"


def namespaces() -> list[str]:
    listed = ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in listed.splitlines() if line.strip()]


def delete_namespace(name: str) -> None:
    """Kills every process inside the namespace, then deletes it (a namespace outlives a `del` while a
    process holds it, and so would its addresses)."""
    for pid in ip("netns", "pids", name, check=False).stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGCONT)  # a paused one too
            os.kill(int(pid), signal.SIGKILL)
    ip("netns", "del", name, check=False)


def sweep(prefix: str) -> list[str]:
    """Removes what runs that no longer live left: namespaces `orh<pid>-*` whose pid is gone, and those
    of this run's own prefix (a run before it that had the same pid). Returns the names it removed."""
    removed = []
    for name in namespaces():
        match = PREFIX_PATTERN.match(name)
        if not match:
            continue
        ours = name.startswith(prefix + "-")
        if ours or not os.path.exists(f"/proc/{match.group(1)}"):
            delete_namespace(name)
            removed.append(name)
    return removed


def check_namespaces_work() -> None:
    """Raises NamespacesUnavailable, saying why, unless this process can make a namespace and a veth pair."""
    probe = f"{run_prefix()}-probe"
    for program, package in (("ip", "iproute2"), ("nft", "nftables"), ("setpriv", "util-linux")):
        if not shutil.which(program):
            raise NamespacesUnavailable(f"`{program}` is not installed (Debian: {package})")
    try:
        for args in (
            ("netns", "add", probe),
            ("-n", probe, "link", "add", "name", "probe0", "type", "veth", "peer", "name", "probe1"),
        ):
            done = ip(*args, check=False)
            if done.returncode:
                raise NamespacesUnavailable(
                    f"`ip {' '.join(args)}` failed ({done.returncode}): {done.stderr.strip()}. The many-machines "
                    "tier needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN) on Linux with iproute2 and nftables."
                )
    except FileNotFoundError as exc:
        raise NamespacesUnavailable(f"{exc.filename} is not installed (Debian: iproute2)") from exc
    finally:
        ip("netns", "del", probe, check=False)


class Network:
    """The bridge and the hosts of one run. `add(host, last_octet)` makes a host; its address is returned."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.bridge = f"{prefix}-net"
        self.addresses: dict[str, str] = {}
        ip("netns", "add", self.bridge)
        ip("-n", self.bridge, "link", "add", "br0", "type", "bridge")
        ip("-n", self.bridge, "link", "set", "br0", "up")

    def namespace(self, host: str) -> str:
        return f"{self.prefix}-{host}"

    def add(self, host: str, last_octet: int) -> str:
        ns, address = self.namespace(host), f"{NETWORK}.{last_octet}"
        ip("netns", "add", ns)
        ip("link", "add", "name", "eth0", "netns", ns, "type", "veth", "peer", "name", host, "netns", self.bridge)
        ip("-n", self.bridge, "link", "set", host, "master", "br0", "up")
        ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
        ip("-n", ns, "link", "set", "eth0", "up")
        self.addresses[host] = address
        return address

    def argv(self, host: str, argv: list[str]) -> list[str]:
        """`argv` run inside the host (ip netns exec runs it in place: the pid is the program's)."""
        return ["ip", "netns", "exec", self.namespace(host), *argv]

    def cut(self, host: str) -> None:
        ip("-n", self.bridge, "link", "set", host, "down")

    def heal(self, host: str) -> None:
        ip("-n", self.bridge, "link", "set", host, "up")

    def drop_between(self, host: str, peer: str) -> None:
        """Every packet between `host` and `peer` dropped, in and out, in `host`'s namespace."""
        address = self.addresses[peer]
        rules = (
            f"add table inet {CUT_TABLE}\n"
            f"add chain inet {CUT_TABLE} out {{ type filter hook output priority 0; }}\n"
            f"add chain inet {CUT_TABLE} in {{ type filter hook input priority 0; }}\n"
            f"add rule inet {CUT_TABLE} out ip daddr {address} drop\n"
            f"add rule inet {CUT_TABLE} in ip saddr {address} drop\n"
        )
        subprocess.run(
            ["ip", "netns", "exec", self.namespace(host), "nft", "-f", "-"],
            input=rules,
            text=True,
            check=True,
            capture_output=True,
            timeout=30,
        )

    def undrop(self, host: str) -> None:
        subprocess.run(
            ["ip", "netns", "exec", self.namespace(host), "nft", "delete", "table", "inet", CUT_TABLE],
            capture_output=True,
            timeout=30,
        )

    def remove(self) -> None:
        for host in list(self.addresses):
            delete_namespace(self.namespace(host))
        delete_namespace(self.bridge)
        self.addresses.clear()


class Inside:
    """A thread that lives in a host's network namespace: what it runs opens its sockets there.

    A network namespace is per thread (setns(2)), so the test process itself reaches the hosts only
    through this thread, as a client on the bridge would, never through a route of the machine's own.
    """

    def __init__(self, network: Network, host: str):
        path = f"/run/netns/{network.namespace(host)}"
        self._pool = concurrent.futures.ThreadPoolExecutor(1, f"in-{host}", initializer=_enter, initargs=(path,))

    def run(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._pool.submit(function, *args, **kwargs).result()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _enter(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns({path}): {os.strerror(errno)}")
    finally:
        os.close(fd)
