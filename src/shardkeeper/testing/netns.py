"""Network partitions for tests: processes in their own Linux network namespaces.

A :class:`NetworkLab` is a private test network on this machine: a bridge in the
host's namespace with the address ``10.200.X.1/24`` (``X`` picked unused at
start), and any number of network namespaces (:class:`Netns`), each joined to the
bridge by a veth pair and given the next address of the subnet. Processes started
with a namespace's :attr:`Netns.prefix` (``ip netns exec NAME``) only see that
namespace's network, so the test can cut them off and heal them:

* :meth:`Netns.cut` / :meth:`Netns.heal`: the veth's host end goes down / up; the
  process keeps running but nothing it sends arrives (an instance partitioned from
  the store; sessions expire on the server side while it runs on).
* :meth:`NetworkLab.isolate` / :meth:`NetworkLab.rejoin`: blackhole routes between
  one namespace and a set of others (both directions), while everything else, the
  host included, still reaches it: a store member partitioned from its peers but
  not from its clients.

Typical use, a 3-member store whose members each live in a namespace, and one
instance of your job in a namespace of its own::

    with NetworkLab() as lab:
        spots = lab.store_members(3)
        zk = ZooKeeperCluster(size=3, host=[n.address for n in spots],
                              prefixes=[n.prefix for n in spots])
        with zk:
            box = lab.namespace("worker")
            proc = subprocess.Popen([*box.prefix, sys.executable, "my_worker.py",
                                     "--url", zk.url("ns", session_timeout=2)])
            box.cut()                      # partition the worker
            ...
            box.heal()
            lab.isolate(spots[0], spots[1:])   # member 0 loses its peers
            ...
            lab.rejoin(spots[0])

All traffic stays on this machine, between the host and namespaces the lab made.
Everything the lab creates (namespaces, veths, the bridge) is removed by
:meth:`NetworkLab.close`, at the end of a ``with`` block, and at interpreter exit;
names embed the creating process id, so :func:`remove_stale` can remove what a
killed test run left behind. It needs root and the ``ip`` tool (iproute2):
:func:`unavailable_reason` says why a lab cannot be made, for ``pytest.skip``.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import os
import random
import re
import shutil
import subprocess
import threading
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self

__all__ = [
    "Netns",
    "NetnsError",
    "NetworkLab",
    "remove_stale",
    "unavailable_reason",
]

#: the private range the labs take their /24 subnets from
SUBNET_PREFIX = "10.200"
#: lab names: bridge ``skbr<pid>_<n>``, veths ``skv<pid>_<n><k><h|n>``, namespaces
#: ``sk-<pid>_<n>-<k>`` (pid and n in base 36; interface names are at most 15 chars)
_NAME_RE = re.compile(r"^sk(?:br|v|-)([0-9a-z]+)_")


class NetnsError(RuntimeError):
    """An ``ip`` command failed; the message names the command and its error."""


def _ip(*args: str, check: bool = True) -> str:
    cmd = ["ip", *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=15, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetnsError(f"{' '.join(cmd)} failed: {exc}") from exc
    if check and proc.returncode != 0:
        raise NetnsError(f"{' '.join(cmd)} failed: {proc.stderr.strip()}")
    return proc.stdout


def unavailable_reason() -> str | None:
    """Why network namespaces cannot be made here (not root, no ``ip``), or None."""
    if shutil.which("ip") is None:
        return "the ip tool (iproute2) is not installed"
    if os.geteuid() != 0:
        return f"network namespaces need root (running as uid {os.geteuid()})"
    probe = f"sk-probe-{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except NetnsError as exc:
        return f"cannot create a network namespace: {exc}"
    _ip("netns", "del", probe, check=False)
    return None


def _b36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if n == 0:
            return out


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class Netns:
    """One network namespace of a lab, joined to the lab's bridge by a veth pair."""

    name: str
    address: str
    host_if: str
    ns_if: str
    #: blackhole routes this namespace currently has (see NetworkLab.isolate)
    blocked: set[str] = field(default_factory=set)
    is_cut: bool = False

    @property
    def prefix(self) -> tuple[str, ...]:
        """Prepend to a command to run it inside the namespace (the pid is kept)."""
        return ("ip", "netns", "exec", self.name)

    def cut(self) -> None:
        """Partition the namespace: its link goes down; its processes keep running."""
        _ip("link", "set", self.host_if, "down")
        self.is_cut = True

    def heal(self) -> None:
        """Undo :meth:`cut`."""
        _ip("link", "set", self.host_if, "up")
        self.is_cut = False

    def block(self, address: str) -> None:
        """Drop everything this namespace sends to ``address`` (a blackhole route)."""
        if address not in self.blocked:
            _ip("-n", self.name, "route", "add", "blackhole", f"{address}/32")
            self.blocked.add(address)

    def unblock(self, address: str) -> None:
        """Undo :meth:`block`."""
        if address in self.blocked:
            _ip("-n", self.name, "route", "del", "blackhole", f"{address}/32", check=False)
            self.blocked.discard(address)


_LABS: set[NetworkLab] = set()
_LABS_LOCK = threading.Lock()
_COUNTER = 0


def _close_all_at_exit() -> None:
    with _LABS_LOCK:
        labs = list(_LABS)
    for lab in labs:
        with contextlib.suppress(Exception):
            lab.close()


atexit.register(_close_all_at_exit)


class NetworkLab:
    """A bridge, a private /24 and the namespaces on it (see the module docstring).

    ``max_namespaces`` bounds how many namespaces :meth:`namespace` may make over
    the lab's life (the subnet has 253 addresses for them).
    """

    def __init__(self, max_namespaces: int = 200) -> None:
        if not 1 <= max_namespaces <= 253:
            raise ValueError(f"max_namespaces must be 1..253, not {max_namespaces!r}")
        global _COUNTER
        reason = unavailable_reason()
        if reason is not None:
            raise NetnsError(f"cannot make a network lab: {reason}")
        with _LABS_LOCK:
            _COUNTER += 1
            self.token = f"{_b36(os.getpid())}_{_b36(_COUNTER % 1296)}"
        self.max_namespaces = max_namespaces
        self.bridge = f"skbr{self.token}"
        self.subnet = self._free_subnet()
        self.host_address = str(self.subnet.network_address + 1)
        self.namespaces: list[Netns] = []
        self._next = 2
        self._lock = threading.Lock()
        self._closed = False
        with _LABS_LOCK:
            _LABS.add(self)
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.host_address}/{self.subnet.prefixlen}", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _free_subnet() -> ipaddress.IPv4Network:
        used = set(
            re.findall(rf"inet {re.escape(SUBNET_PREFIX)}\.(\d+)\.", _ip("-o", "-4", "addr"))
        )
        free = [x for x in range(1, 255) if str(x) not in used]
        if not free:
            raise NetnsError(f"every {SUBNET_PREFIX}.X.0/24 subnet is in use on this machine")
        return ipaddress.IPv4Network(f"{SUBNET_PREFIX}.{random.choice(free)}.0/24")

    def namespace(self) -> Netns:
        """A new namespace on the lab's bridge, with the next free address."""
        with self._lock:
            if self._closed:
                raise NetnsError("the network lab is closed")
            if self._next - 2 >= self.max_namespaces:
                raise NetnsError(
                    f"this lab already made {self.max_namespaces} namespaces (max_namespaces)"
                )
            k = self._next
            self._next += 1
        name = f"sk-{self.token}-{k}"
        ns = Netns(
            name=name,
            address=str(self.subnet.network_address + k),
            host_if=f"skv{self.token}{_b36(k):0>2}h",
            ns_if=f"skv{self.token}{_b36(k):0>2}n",
        )
        with self._lock:
            self.namespaces.append(ns)
        try:
            _ip("netns", "add", name)
            _ip("link", "add", ns.host_if, "type", "veth", "peer", "name", ns.ns_if)
            _ip("link", "set", ns.ns_if, "netns", name)
            _ip("link", "set", ns.host_if, "master", self.bridge)
            _ip("link", "set", ns.host_if, "up")
            _ip("-n", name, "addr", "add", f"{ns.address}/{self.subnet.prefixlen}", "dev", ns.ns_if)
            _ip("-n", name, "link", "set", ns.ns_if, "up")
            _ip("-n", name, "link", "set", "lo", "up")
        except BaseException:
            self.remove(ns)
            raise
        return ns

    def store_members(self, size: int) -> list[Netns]:
        """``size`` namespaces for the members of a store cluster: pass their
        addresses as ``host=`` and their prefixes as ``prefixes=`` to
        :class:`~shardkeeper.testing.servers.ZooKeeperCluster` or
        :class:`~shardkeeper.testing.servers.EtcdCluster`."""
        if size < 1:
            raise ValueError(f"size must be at least 1, not {size!r}")
        return [self.namespace() for _ in range(size)]

    def isolate(self, ns: Netns, others: list[Netns]) -> None:
        """Partition ``ns`` from ``others`` (both directions); the host and every
        other namespace still reach it."""
        for other in others:
            if other is ns:
                continue
            ns.block(other.address)
            other.block(ns.address)

    def rejoin(self, ns: Netns) -> None:
        """Undo every :meth:`isolate` of ``ns``."""
        for other in self.namespaces:
            other.unblock(ns.address)
        for address in list(ns.blocked):
            ns.unblock(address)

    def remove(self, ns: Netns) -> None:
        """Delete one namespace and its veth pair (its processes lose their network)."""
        _ip("link", "del", ns.host_if, check=False)
        _ip("netns", "del", ns.name, check=False)
        with self._lock:
            if ns in self.namespaces:
                self.namespaces.remove(ns)
        for other in self.namespaces:
            other.unblock(ns.address)

    def close(self) -> None:
        """Remove every namespace, veth and the bridge. Idempotent."""
        with self._lock:
            self._closed = True
            spaces = list(self.namespaces)
        for ns in spaces:
            self.remove(ns)
        _ip("link", "del", self.bridge, check=False)
        with _LABS_LOCK:
            _LABS.discard(self)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<NetworkLab {self.bridge} {self.subnet} namespaces={len(self.namespaces)}>"


def remove_stale() -> list[str]:
    """Remove namespaces, veths and bridges that labs of dead processes left behind.

    Only names of the lab's own pattern whose creating process is gone are touched.
    Returns the names removed.
    """
    removed: list[str] = []

    def owner_dead(name: str) -> bool:
        m = _NAME_RE.match(name)
        return m is not None and not _pid_alive(int(m.group(1), 36))

    for line in _ip("netns", "list", check=False).splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith("sk-") and owner_dead(name):
            _ip("netns", "del", name, check=False)
            removed.append(name)
    for line in _ip("-o", "link", "show", check=False).splitlines():
        parts = line.split(":")
        if len(parts) < 2:
            continue
        name = parts[1].strip().split("@")[0]
        if name.startswith("sk") and owner_dead(name):
            _ip("link", "del", name, check=False)
            removed.append(name)
    return removed
