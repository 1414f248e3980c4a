"""The common machinery of the test clusters (:class:`ServerCluster`): start with
retries on taken ports, bounded readiness waits, per-member fault injection (kill,
pause, resume, restart), status probes, and the ``atexit`` safety net that stops
every cluster a test run left behind.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Self
from urllib.parse import quote

from shardkeeper.testing.servers.members import Member, MemberStatus
from shardkeeper.testing.servers.processes import (
    LOOPBACK,
    Backend,
    ClusterError,
    free_ports,
    kill_group,
    spawn,
)
from shardkeeper.testing.servers.state import attach, cluster_state

__all__ = ["ServerCluster"]

# Strong references on purpose: a cluster dropped without stop() must still be
# stopped at exit, so garbage collection must not take it out of this set.
_LIVE: set[ServerCluster] = set()
_LIVE_LOCK = threading.Lock()


def _stop_all_at_exit() -> None:
    # Safety net: a test run that dies between start() and stop() must not leave
    # JVMs and etcds running on a machine shared with other people.
    with _LIVE_LOCK:
        clusters = list(_LIVE)
    for cluster in clusters:
        with contextlib.suppress(Exception):
            cluster.stop()


atexit.register(_stop_all_at_exit)


class ServerCluster:
    """Common machinery of :class:`ZooKeeperCluster` and :class:`EtcdCluster`.

    ``size``: 1 or 3 members. ``base_dir``: where data and logs go (created; its
    ``member-N`` sub-directories are wiped at :meth:`start` unless ``keep_data``).
    ``detached``: the processes must outlive this Python process (the ``up`` command):
    no ``atexit`` stop and no parent-death signal. ``start_timeout``: seconds to wait
    for readiness at start and restart. ``host``: the address every member binds and
    clients dial (default ``127.0.0.1``), or one address per member, e.g. the addresses
    of network namespaces made by :class:`shardkeeper.testing.netns.NetworkLab`.
    ``prefixes``: one command prefix per member, prepended to its server command
    (``NetworkLab.store_members`` gives ``ip netns exec NAME`` ones).
    """

    backend: ClassVar[Backend]
    scheme: ClassVar[str]

    def __init__(
        self,
        size: int = 1,
        base_dir: str | os.PathLike[str] | None = None,
        *,
        detached: bool = False,
        start_timeout: float = 30.0,
        keep_data: bool = False,
        host: str | Sequence[str] = LOOPBACK,
        prefixes: Sequence[Sequence[str]] | None = None,
    ) -> None:
        if size not in (1, 3, 5):
            raise ValueError(f"size must be 1, 3 or 5 members, not {size!r}")
        self.size = size
        hosts = [host] * size if isinstance(host, str) else list(host)
        if len(hosts) != size or not all(isinstance(h, str) and h for h in hosts):
            raise ValueError(f"host must be one address or one per member ({size}), not {host!r}")
        if prefixes is not None and len(prefixes) != size:
            raise ValueError(
                f"prefixes must give one command prefix per member ({size}), not {prefixes!r}"
            )
        #: the bind address of each member (default loopback)
        self.member_hosts = hosts
        self._prefixes = [tuple(p) for p in prefixes] if prefixes is not None else [()] * size
        if base_dir is None:
            import tempfile

            base_dir = tempfile.mkdtemp(prefix=f"shardkeeper-{self.backend}-")
        self.base_dir = Path(base_dir).resolve()
        self.detached = detached
        self.start_timeout = start_timeout
        self.keep_data = keep_data
        self.members: list[Member] = []
        #: seconds the last start() took until every member was ready
        self.start_seconds: float | None = None
        self._lock = threading.RLock()

    # -- public API -----------------------------------------------------------

    @property
    def hosts(self) -> list[tuple[str, int]]:
        """``(host, client_port)`` of every member, in member order."""
        return [(m.host, m.client_port) for m in self.members]

    @property
    def hosts_string(self) -> str:
        """``host:port,host:port`` of every member."""
        return ",".join(f"{h}:{p}" for h, p in self.hosts)

    @property
    def credentials(self) -> tuple[str, str] | None:
        """``(user, password)`` that clients must use, or None without auth."""
        return None

    def url(self, namespace: str = "default", **options: float | str | None) -> str:
        """A registry URL on this cluster, e.g. ``url("t1", session_timeout=2)``.

        Options become query parameters (see :mod:`shardkeeper.registry.url`); an
        option given None is left out. The credentials are included when the cluster
        requires them.
        """
        if not self.members:
            raise ClusterError(f"{type(self).__name__} is not started: it has no address yet")
        auth = ""
        creds = self.credentials
        if creds is not None:
            auth = f"{quote(creds[0], safe='')}:{quote(creds[1], safe='')}@"
        query = "&".join(
            f"{k}={v:g}" if isinstance(v, float) else f"{k}={quote(str(v), safe='')}"
            for k, v in options.items()
            if v is not None
        )
        return f"{self.scheme}://{auth}{self.hosts_string}/{namespace.strip('/')}" + (
            f"?{query}" if query else ""
        )

    def start(self) -> None:
        """Launch every member on fresh free ports and wait until all serve.

        A start that fails because a chosen port was taken meanwhile is retried on new
        ports (three attempts). Raises :class:`ClusterError` with the server log tail.
        """
        with self._lock:
            if self.members and any(m.alive() for m in self.members):
                raise ClusterError(f"{type(self).__name__} already started")
            began = time.monotonic()
            last: ClusterError | None = None
            for _attempt in range(3):
                self._prepare_members()
                try:
                    for m in self.members:
                        self._launch(m)
                    if not self.detached:
                        with _LIVE_LOCK:
                            _LIVE.add(self)
                    self._wait_ready(range(self.size), self.start_timeout)
                    self._after_start()
                    self.start_seconds = time.monotonic() - began
                    return
                except ClusterError as exc:
                    last = exc
                    port_clash = any(m.port_clash() for m in self.members)
                    self._kill_all()
                    if not port_clash:
                        raise
                except BaseException:
                    # Popen failing, Ctrl-C, a pytest timeout: never leave half a cluster
                    self._kill_all()
                    raise
            assert last is not None
            raise last

    def stop(self) -> None:
        """Kill every member's process group and wait until each process is gone.

        Idempotent. Data and logs stay under ``base_dir`` for post-mortems.
        """
        with self._lock:
            self._kill_all()
            with _LIVE_LOCK:
                _LIVE.discard(self)

    def kill(self, i: int) -> None:
        """SIGKILL member ``i`` (its whole process group) and wait until it is gone."""
        with self._lock:
            self._kill_member(self.members[i])

    def pause(self, i: int) -> None:
        """SIGSTOP member ``i``: its sockets stay open but it answers nothing."""
        with self._lock:
            m = self.members[i]
            self._signal(m, signal.SIGSTOP)
            m.paused = True
            # kill() returns once the signal is queued; a thread busy on the other core
            # may still answer a request sent right after. Return once every thread is
            # stopped, so "paused" means "answers nothing" (bounded: a thread that does
            # not stop within 5 s is reported, not waited for)
            if m.pid is not None:
                _wait_stopped(m.pid, 5.0)

    def resume(self, i: int) -> None:
        """SIGCONT member ``i`` after :meth:`pause`."""
        with self._lock:
            m = self.members[i]
            self._signal(m, signal.SIGCONT)
            m.paused = False

    def restart(self, i: int, *, wait: bool = True, timeout: float | None = None) -> None:
        """(Re)start member ``i`` on the same ports with the same data.

        A running member is killed first. With ``wait`` (default), returns once the
        member serves again (for an ensemble member that needs a quorum of others).
        """
        with self._lock:
            m = self.members[i]
            if m.alive():
                self._kill_member(m)
            self._launch(m)
            if wait:
                self._wait_ready([i], timeout if timeout is not None else self.start_timeout)

    def ensure_all_up(self, timeout: float | None = None) -> list[int]:
        """Resume paused members and restart dead ones; wait until all serve.

        Returns the indexes that needed repair. Used between fault tests that share
        one cluster.
        """
        with self._lock:
            fixed: list[int] = []
            for m in self.members:
                if m.alive() and m.paused:
                    self._signal(m, signal.SIGCONT)
                    m.paused = False
                    fixed.append(m.index)
                elif not m.alive():
                    self._launch(m)
                    fixed.append(m.index)
            self._wait_ready(range(self.size), timeout or self.start_timeout)
            return fixed

    def member_status(self, i: int) -> MemberStatus:
        """Probe member ``i`` now: process, pause state, readiness, role."""
        m = self.members[i]
        running = m.alive()
        role = self._probe(m) if running and not m.paused else None
        return MemberStatus(
            index=i,
            pid=m.pid if running else None,
            client_port=m.client_port,
            running=running,
            paused=running and m.paused,
            serving=role is not None,
            role=role or None,
        )

    def status(self) -> list[MemberStatus]:
        """:meth:`member_status` of every member."""
        return [self.member_status(i) for i in range(len(self.members))]

    def healthy(self) -> bool:
        """Whether every member serves right now."""
        return bool(self.members) and all(s.serving for s in self.status())

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} size={self.size} hosts={self.hosts_string or '-'}>"

    # -- state (for the detached `up`/`down`/`status` commands) ------------------

    def to_state(self) -> dict[str, Any]:
        """A JSON-friendly description from which :meth:`from_state` re-attaches."""
        return cluster_state(self)

    @staticmethod
    def from_state(state: Mapping[str, Any]) -> ServerCluster:
        """Re-attach to processes described by :meth:`to_state` (not our children).

        A pid is only trusted if that process's command line still names the member's
        directory, so a recycled pid is never killed by mistake.
        """
        return attach(state)

    # -- to be provided by the backends -------------------------------------------

    def _command(self, m: Member) -> list[str]:
        raise NotImplementedError

    def _write_config(self, m: Member) -> None:
        """Write whatever the member needs on disk before its first launch."""

    def _probe(self, m: Member) -> str:
        """The member's role if it serves right now, else ``""``."""
        raise NotImplementedError

    def _cluster_ready(self) -> bool:
        """Extra whole-cluster condition once each member serves (e.g. one leader)."""
        return True

    def _after_start(self) -> None:
        """Work after the first readiness (etcd: enable auth)."""

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _load_extra_state(self, extra: Mapping[str, Any]) -> None:
        """Restore what :meth:`_extra_state` saved."""

    # -- machinery --------------------------------------------------------------

    def _prepare_members(self) -> None:
        ports = free_ports(3 * self.size)
        self.members = []
        for i in range(self.size):
            mdir = self.base_dir / f"member-{i}"
            if mdir.exists() and not self.keep_data:
                shutil.rmtree(mdir)
            mdir.mkdir(parents=True, exist_ok=True)
            self.members.append(
                Member(
                    index=i,
                    client_port=ports[3 * i],
                    peer_port=ports[3 * i + 1],
                    election_port=ports[3 * i + 2],
                    base_dir=mdir,
                    host=self.member_hosts[i],
                    prefix=self._prefixes[i],
                )
            )
        for m in self.members:
            m.data_dir.mkdir(parents=True, exist_ok=True)
            self._write_config(m)

    def _launch(self, m: Member) -> None:
        spawn(m, self._command(m), detached=self.detached)

    def _signal(self, m: Member, sig: signal.Signals) -> None:
        if m.pid is None or not m.alive():
            raise ClusterError(f"member {m.index} of {self!r} is not running")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(m.pid, sig)

    def _kill_member(self, m: Member, timeout: float = 10.0) -> None:
        kill_group(m, timeout)

    def _kill_all(self) -> None:
        errors: list[str] = []
        for m in self.members:
            try:
                self._kill_member(m)
            except ClusterError as exc:
                errors.append(str(exc))
        if errors:
            raise ClusterError("; ".join(errors))

    def _wait_ready(self, indexes: Sequence[int] | range, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        pending = list(indexes)
        while True:
            for i in list(pending):
                m = self.members[i]
                if not m.alive():
                    raise ClusterError(
                        f"{self.backend} member {i} (port {m.client_port}) exited during "
                        f"start; log {m.log_path}:\n{m.log_tail()}"
                    )
                if self._probe(m):
                    pending.remove(i)
                elif m.port_clash():
                    # ZooKeeper does not exit when its election port is taken, it
                    # retries forever: fail now so start() can retry on other ports
                    raise ClusterError(
                        f"{self.backend} member {i}: a port was taken by another process; "
                        f"log {m.log_path}:\n{m.log_tail()}"
                    )
            if not pending and self._cluster_ready():
                return
            if time.monotonic() > deadline:
                bad = pending or list(indexes)
                tails = "\n".join(
                    f"member {i} log {self.members[i].log_path}:\n{self.members[i].log_tail()}"
                    for i in bad
                )
                raise ClusterError(
                    f"{self.backend} members {bad} not ready within {timeout:g} s\n{tails}"
                )
            time.sleep(0.02)


def _wait_stopped(group: int, timeout: float) -> None:
    """Wait until every thread of every process in process group ``group`` is stopped
    (Linux /proc; elsewhere there is nothing to read and this returns at once)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(state in ("T", "t") for state in _thread_states(group)):
            return
        time.sleep(0.005)  # polling /proc: there is no event for "stopped"
    raise ClusterError(f"process group {group} did not stop within {timeout} s of SIGSTOP")


def _thread_states(group: int) -> list[str]:
    """The scheduler state letter of each thread of the processes in ``group``."""
    states: list[str] = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != group:  # fields: state, ppid, pgrp, ...
                continue
            for task in (proc / "task").iterdir():
                states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
        except (OSError, IndexError, ValueError):
            continue  # a process or thread that ended while we looked
    return states
