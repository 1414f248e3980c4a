"""Real ZooKeeper and etcd servers on loopback, for tests and local development.

:class:`ZooKeeperCluster` and :class:`EtcdCluster` launch 1 or 3 real server processes
(Debian's ``/usr/share/java/zookeeper.jar`` and ``/usr/bin/etcd``) on free loopback
ports, wait until they really serve, and give tests per-member fault injection::

    with ZooKeeperCluster(size=3, base_dir=tmp) as zk:
        store = open_store(zk.url("my-test", session_timeout=2))
        zk.kill(zk.leader())          # SIGKILL
        zk.restart(0)                 # same ports and data, waits until it serves

Every process runs in its own process group, so :meth:`stop` (and the ``atexit``
safety net) kills the whole group and leaves nothing behind. Data directories and
server logs live under ``base_dir`` (``member-N/data``, ``member-N/server.log``).

Readiness is checked for real, within a bounded deadline: a ZooKeeper member is ready
when it answers ``srvr`` with a ``Mode:`` line (``ruok`` answers ``imok`` even without
quorum), an etcd member when ``GET /health`` says ``"health":"true"``.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Literal, Self
from urllib.parse import quote

__all__ = [
    "ClusterError",
    "EtcdCluster",
    "Member",
    "MemberStatus",
    "ServerCluster",
    "ZooKeeperCluster",
    "free_ports",
    "pid_alive",
]

LOOPBACK = "127.0.0.1"

#: Where Debian puts ZooKeeper; the jar's manifest pulls its own dependencies, but the
#: slf4j binding must be on the class path or the server logs nothing at all.
ZOOKEEPER_CLASSPATH = (
    "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-api.jar:/usr/share/java/slf4j-simple.jar"
)
ETCD_BINARY = "/usr/bin/etcd"
ETCDCTL_BINARY = "/usr/bin/etcdctl"

Backend = Literal["zookeeper", "etcd"]


class ClusterError(RuntimeError):
    """A server could not be started, or did not become ready in time.

    The message names the member, the deadline and the tail of its server log.
    """


# ---- processes and ports ----------------------------------------------------------


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports that were free a moment ago.

    All sockets are held open until every port is chosen, so the ports are distinct;
    another process may still grab one before the server binds it, which is why the
    clusters retry a start that fails on a taken port.
    """
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((LOOPBACK, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _proc_state(pid: int) -> str | None:
    """The one-letter state from /proc/PID/stat, or None if there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # the command name is in parentheses and may itself contain spaces or parentheses
    return raw.rsplit(")", 1)[1].split()[0]


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie counts as dead: it serves nothing).

    Detached servers are re-parented to PID 1, which may never reap them here, so a
    killed server can linger as a zombie; ``os.kill(pid, 0)`` would call it alive.
    """
    state = _proc_state(pid)
    return state is not None and state not in ("Z", "X")


def _proc_cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _child_env() -> dict[str, str]:
    # ETCD_* / ETCDCTL_* variables override etcd flags; a developer's shell settings
    # must not leak into the servers we start (for example ETCD_DATA_DIR).
    return {
        k: v for k, v in os.environ.items() if not k.startswith(("ETCD_", "ETCDCTL_", "JAVA_TOOL"))
    }


# ---- members ---------------------------------------------------------------------


@dataclass
class MemberStatus:
    """What one member is doing right now (see :meth:`ServerCluster.member_status`).

    ``running``: the process exists (possibly paused); ``paused``: stopped by SIGSTOP;
    ``serving``: it answered the readiness probe just now; ``role``: ZooKeeper's
    ``Mode:`` (standalone/leader/follower) or etcd's ``leader``/``follower``, else None.
    """

    index: int
    pid: int | None
    client_port: int
    running: bool
    paused: bool
    serving: bool
    role: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict of the fields."""
        return {
            "index": self.index,
            "pid": self.pid,
            "client_port": self.client_port,
            "running": self.running,
            "paused": self.paused,
            "serving": self.serving,
            "role": self.role,
        }


@dataclass
class Member:
    """One server process of a cluster: its ports, directories and process.

    ``peer_port`` is ZooKeeper's quorum port or etcd's peer port; ``election_port`` is
    ZooKeeper's leader-election port (unused by etcd).
    """

    index: int
    client_port: int
    peer_port: int
    election_port: int
    base_dir: Path
    #: the address the member binds and clients dial (``host`` of the cluster)
    host: str = LOOPBACK
    #: command prefix the member is launched with (e.g. ``ip netns exec NAME``)
    prefix: tuple[str, ...] = ()
    pid: int | None = None
    paused: bool = False
    #: where the latest launch's output starts in the log (earlier launches are above)
    log_offset: int = 0
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def data_dir(self) -> Path:
        """The member's data directory (kept across :meth:`ServerCluster.restart`)."""
        return self.base_dir / "data"

    @property
    def log_path(self) -> Path:
        """The member's server log (stdout and stderr of the process, appended)."""
        return self.base_dir / "server.log"

    def alive(self) -> bool:
        """Whether the member's process exists (paused counts as alive)."""
        if self.popen is not None:
            # poll() reaps our own child, so a killed one does not linger as a zombie
            return self.popen.poll() is None
        return self.pid is not None and pid_alive(self.pid)

    def log_tail(self, lines: int = 15, max_bytes: int = 65536) -> str:
        """The last ``lines`` lines of the server log (at most its last ``max_bytes``)."""
        try:
            with self.log_path.open("rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - max_bytes))
                text = fh.read().decode(errors="replace")
        except OSError:
            return "(no server log)"
        return "\n".join(text.splitlines()[-lines:])

    def port_clash(self) -> bool:
        """Whether the log of the latest launch says one of its ports was taken."""
        try:
            with self.log_path.open("rb") as fh:
                fh.seek(self.log_offset)
                text = fh.read(1 << 20).decode(errors="replace")
        except OSError:
            return False
        return "address already in use" in text.lower()


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

    def url(self, namespace: str = "default", **options: float | str) -> str:
        """A registry URL on this cluster, e.g. ``url("t1", session_timeout=2)``.

        Options become query parameters (see :mod:`shardkeeper.registry.url`); the
        credentials are included when the cluster requires them.
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
        return {
            "backend": self.backend,
            "size": self.size,
            "base_dir": str(self.base_dir),
            "extra": self._extra_state(),
            "members": [
                {
                    "index": m.index,
                    "pid": m.pid,
                    "client_port": m.client_port,
                    "peer_port": m.peer_port,
                    "election_port": m.election_port,
                    "host": m.host,
                    "dir": str(m.base_dir),
                }
                for m in self.members
            ],
        }

    @staticmethod
    def from_state(state: Mapping[str, Any]) -> ServerCluster:
        """Re-attach to processes described by :meth:`to_state` (not our children).

        A pid is only trusted if that process's command line still names the member's
        directory, so a recycled pid is never killed by mistake.
        """
        cls: type[ServerCluster] = (
            ZooKeeperCluster if state["backend"] == "zookeeper" else EtcdCluster
        )
        cluster = cls(size=int(state["size"]), base_dir=state["base_dir"], detached=True)
        cluster._load_extra_state(state.get("extra") or {})
        for raw in state["members"]:
            m = Member(
                index=int(raw["index"]),
                client_port=int(raw["client_port"]),
                peer_port=int(raw["peer_port"]),
                election_port=int(raw["election_port"]),
                base_dir=Path(raw["dir"]),
                host=str(raw.get("host") or LOOPBACK),
            )
            pid = raw.get("pid")
            if isinstance(pid, int) and pid_alive(pid) and str(m.base_dir) in _proc_cmdline(pid):
                m.pid = pid
                m.paused = _proc_state(pid) == "T"
            cluster.members.append(m)
        return cluster

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
        # a prefix such as ``ip netns exec NAME`` execs the server: the pid stays its own
        cmd = [*m.prefix, *self._command(m)]
        # The parent-death signal kills the server if this Python process dies without
        # running atexit (SIGKILL, OOM). The kernel sends it when the spawning *thread*
        # exits, so it is only safe from the main thread, and never for detached servers.
        if (
            not self.detached
            and threading.current_thread() is threading.main_thread()
            and shutil.which("setpriv")
        ):
            cmd = ["setpriv", "--pdeathsig", "KILL", "--", *cmd]
        with m.log_path.open("ab") as log:
            log.write(
                f"--- launch {time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(cmd)}\n".encode()
            )
            log.flush()
            m.log_offset = log.tell()
            m.popen = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=m.base_dir,
                env=_child_env(),
                close_fds=True,
                start_new_session=True,  # own process group: killpg takes everything
            )
        m.pid = m.popen.pid
        m.paused = False

    def _signal(self, m: Member, sig: signal.Signals) -> None:
        if m.pid is None or not m.alive():
            raise ClusterError(f"member {m.index} of {self!r} is not running")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(m.pid, sig)

    def _kill_member(self, m: Member, timeout: float = 10.0) -> None:
        if m.pid is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(m.pid, signal.SIGKILL)
        if m.popen is not None:
            try:
                m.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                raise ClusterError(f"member {m.index} (pid {m.pid}) survived SIGKILL") from None
        else:
            deadline = time.monotonic() + timeout
            while pid_alive(m.pid):
                if time.monotonic() > deadline:
                    raise ClusterError(f"member {m.index} (pid {m.pid}) survived SIGKILL")
                time.sleep(0.01)
        m.pid = None
        m.popen = None
        m.paused = False

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


# ---- ZooKeeper ----------------------------------------------------------------------


def four_letter_word(host: str, port: int, word: str, timeout: float = 1.0) -> str:
    """Send a ZooKeeper four-letter command (``srvr``, ``mntr``...) and return the reply.

    Returns ``""`` when the server cannot be reached or does not answer in time.
    """
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(word.encode())
            chunks: list[bytes] = []
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                chunks.append(chunk)
    except OSError:
        return ""
    return b"".join(chunks).decode(errors="replace")


def zookeeper_mode(host: str, port: int, timeout: float = 1.0) -> str:
    """The ``Mode:`` a ZooKeeper server reports (standalone/leader/follower), or ``""``.

    A member without quorum answers ``srvr`` with "not currently serving requests" and
    no Mode line, which is exactly why this, not ``ruok``, tells readiness.
    """
    for line in four_letter_word(host, port, "srvr", timeout).splitlines():
        if line.startswith("Mode:"):
            return line.split(":", 1)[1].strip()
    return ""


class ZooKeeperCluster(ServerCluster):
    """A real ZooKeeper 3.8 standalone server (``size=1``) or ensemble (``size=3``).

    Runs ``java -Xmx96m ... QuorumPeerMain zoo.cfg`` per member with tickTime=200 and
    sessions allowed from 0.4 s to 60 s. ``heap_mb`` caps each JVM's heap.
    """

    backend: ClassVar[Backend] = "zookeeper"
    scheme: ClassVar[str] = "zk"

    def __init__(
        self,
        size: int = 1,
        base_dir: str | os.PathLike[str] | None = None,
        *,
        detached: bool = False,
        start_timeout: float = 30.0,
        keep_data: bool = False,
        heap_mb: int = 96,
        tick_ms: int = 200,
        host: str | Sequence[str] = LOOPBACK,
        prefixes: Sequence[Sequence[str]] | None = None,
    ) -> None:
        super().__init__(
            size,
            base_dir,
            detached=detached,
            start_timeout=start_timeout,
            keep_data=keep_data,
            host=host,
            prefixes=prefixes,
        )
        self.heap_mb = heap_mb
        self.tick_ms = tick_ms

    def leader(self) -> int:
        """Index of the member whose Mode is leader (or the standalone one)."""
        for m in self.members:
            if m.alive() and not m.paused and self._probe(m) in ("leader", "standalone"):
                return m.index
        raise ClusterError(f"{self!r} has no leader right now")

    def followers(self) -> list[int]:
        """Indexes of the members whose Mode is follower."""
        return [
            m.index
            for m in self.members
            if m.alive() and not m.paused and self._probe(m) == "follower"
        ]

    def config_text(self, m: Member) -> str:
        """The zoo.cfg of member ``m`` (see registry/zookeeper/zoo.cfg.template)."""
        lines = [
            f"tickTime={self.tick_ms}",
            f"initLimit={10 if self.size == 1 else 50}",
            "syncLimit=5",
            f"dataDir={m.data_dir}",
            f"clientPort={m.client_port}",
            f"clientPortAddress={m.host}",
            # the session timeouts tests need: 2 tickTimes minimum, and far above the
            # default cap of 20 x tickTime (4 s) so session_timeout=10 is honoured
            f"minSessionTimeout={2 * self.tick_ms}",
            "maxSessionTimeout=60000",
            "admin.enableServer=false",
            "4lw.commands.whitelist=*",
            "maxClientCnxns=0",
            # keep disk use of long runs bounded
            "autopurge.snapRetainCount=3",
            "autopurge.purgeInterval=1",
        ]
        if self.size > 1:
            for other in self.members:
                lines.append(
                    f"server.{other.index + 1}={other.host}:{other.peer_port}:{other.election_port}"
                )
        return "\n".join(lines) + "\n"

    def _write_config(self, m: Member) -> None:
        (m.base_dir / "zoo.cfg").write_text(self.config_text(m))
        if self.size > 1:
            (m.data_dir / "myid").write_text(f"{m.index + 1}\n")

    def _command(self, m: Member) -> list[str]:
        java = shutil.which("java") or "/usr/bin/java"
        return [
            java,
            "-Xms16m",
            f"-Xmx{self.heap_mb}m",
            "-Xss512k",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",  # C1 only: faster start, less memory
            "-XX:-UsePerfData",
            "-Djava.awt.headless=true",
            "-Dzookeeper.jmx.log4j.disable=true",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=info",
            "-Dorg.slf4j.simpleLogger.showDateTime=true",
            "-cp",
            ZOOKEEPER_CLASSPATH,
            "org.apache.zookeeper.server.quorum.QuorumPeerMain",
            str(m.base_dir / "zoo.cfg"),
        ]

    def _probe(self, m: Member) -> str:
        return zookeeper_mode(m.host, m.client_port, timeout=0.5)

    def _cluster_ready(self) -> bool:
        if self.size == 1:
            return True
        modes = [self._probe(m) for m in self.members if m.alive() and not m.paused]
        return modes.count("leader") == 1


# ---- etcd ---------------------------------------------------------------------------


def etcd_health(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether ``GET /health`` of an etcd member reports ``"health":"true"``."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=timeout) as resp:
            body = json.loads(resp.read().decode())
    except (OSError, ValueError, urllib.error.URLError):
        return False
    return str(body.get("health")).lower() == "true"


class EtcdCluster(ServerCluster):
    """A real etcd 3.4 member (``size=1``) or cluster (``size=3``) on loopback.

    ``heartbeat_ms``/``election_ms`` default to 20/200, which lets 1 s leases work
    (the minimum lease TTL is about 1.5 x the election timeout). With ``auth=True``
    a ``root`` user with :attr:`password` is created and authentication enabled;
    :attr:`credentials` and :meth:`url` then carry them.
    """

    backend: ClassVar[Backend] = "etcd"
    scheme: ClassVar[str] = "etcd"

    def __init__(
        self,
        size: int = 1,
        base_dir: str | os.PathLike[str] | None = None,
        *,
        auth: bool = False,
        password: str | None = None,
        detached: bool = False,
        start_timeout: float = 30.0,
        keep_data: bool = False,
        heartbeat_ms: int = 20,
        election_ms: int = 200,
        host: str | Sequence[str] = LOOPBACK,
        prefixes: Sequence[Sequence[str]] | None = None,
    ) -> None:
        super().__init__(
            size,
            base_dir,
            detached=detached,
            start_timeout=start_timeout,
            keep_data=keep_data,
            host=host,
            prefixes=prefixes,
        )
        self.auth = auth
        #: user name of the root account when ``auth`` is on
        self.username = "root"
        #: password of the root account when ``auth`` is on
        self.password = password or ("sk-" + uuid.uuid4().hex[:16])
        self.heartbeat_ms = heartbeat_ms
        self.election_ms = election_ms
        # a unique token keeps a stray member of another test cluster from joining ours
        self.cluster_token = "shardkeeper-" + uuid.uuid4().hex[:12]

    @property
    def credentials(self) -> tuple[str, str] | None:
        """``("root", password)`` when auth is enabled, else None."""
        return (self.username, self.password) if self.auth else None

    @property
    def endpoints(self) -> list[str]:
        """Client URLs (``http://127.0.0.1:PORT``) of every member."""
        return [f"http://{m.host}:{m.client_port}" for m in self.members]

    def leader(self) -> int:
        """Index of the current raft leader."""
        for m in self.members:
            if m.alive() and not m.paused and self._probe(m) == "leader":
                return m.index
        raise ClusterError(f"{self!r} has no leader right now")

    def etcdctl(self, *args: str, timeout: float = 10.0) -> str:
        """Run ``etcdctl`` (API v3) against every member with the root credentials."""
        cmd = [ETCDCTL_BINARY, f"--endpoints={','.join(self.endpoints)}", "--dial-timeout=3s"]
        if self.auth and self._auth_enabled:
            cmd.append(f"--user={self.username}:{self.password}")
        env = _child_env()
        env["ETCDCTL_API"] = "3"
        proc = subprocess.run(
            [*cmd, *args], capture_output=True, text=True, timeout=timeout, env=env, check=False
        )
        if proc.returncode != 0:
            raise ClusterError(f"etcdctl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout

    _auth_enabled = False

    def _after_start(self) -> None:
        if not self.auth:
            return
        self._auth_enabled = False
        self.etcdctl("user", "add", f"{self.username}:{self.password}", "--interactive=false")
        self.etcdctl("user", "grant-role", self.username, "root")
        self.etcdctl("auth", "enable")
        self._auth_enabled = True

    def _extra_state(self) -> dict[str, Any]:
        return {
            "auth": self.auth,
            "password": self.password if self.auth else None,
            "cluster_token": self.cluster_token,
            "heartbeat_ms": self.heartbeat_ms,
            "election_ms": self.election_ms,
        }

    def _load_extra_state(self, extra: Mapping[str, Any]) -> None:
        self.auth = bool(extra.get("auth"))
        self._auth_enabled = self.auth
        if extra.get("password"):
            self.password = str(extra["password"])
        self.cluster_token = str(extra.get("cluster_token") or self.cluster_token)
        self.heartbeat_ms = int(extra.get("heartbeat_ms") or self.heartbeat_ms)
        self.election_ms = int(extra.get("election_ms") or self.election_ms)

    def _command(self, m: Member) -> list[str]:
        name = f"member-{m.index}"
        client = f"http://{m.host}:{m.client_port}"
        peer = f"http://{m.host}:{m.peer_port}"
        initial = ",".join(f"member-{o.index}=http://{o.host}:{o.peer_port}" for o in self.members)
        return [
            ETCD_BINARY,
            f"--name={name}",
            f"--data-dir={m.data_dir}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster={initial}",
            "--initial-cluster-state=new",  # ignored on restart: the data dir wins
            f"--initial-cluster-token={self.cluster_token}",
            f"--heartbeat-interval={self.heartbeat_ms}",
            f"--election-timeout={self.election_ms}",
            "--logger=zap",
            "--log-outputs=stderr",
            # small WAL/snapshot footprint for short-lived test servers
            "--snapshot-count=10000",
            "--quota-backend-bytes=268435456",
        ]

    def _probe(self, m: Member) -> str:
        if not etcd_health(m.host, m.client_port, timeout=0.5):
            return ""
        return self._role(m) or "member"

    def _role(self, m: Member) -> str:
        # /v3/maintenance/status through the HTTP gateway: no client library needed,
        # and it works without credentials even when auth is enabled
        try:
            req = urllib.request.Request(
                f"http://{m.host}:{m.client_port}/v3/maintenance/status",
                data=b"{}",
                method="POST",
            )
            with urllib.request.urlopen(req, timeout=0.5) as resp:
                body = json.loads(resp.read().decode())
        except (OSError, ValueError, urllib.error.URLError):
            return ""
        header = body.get("header") or {}
        member_id, leader = header.get("member_id"), body.get("leader")
        if member_id is None or leader is None:
            return ""
        return "leader" if str(member_id) == str(leader) else "follower"


def cluster_class(backend: str) -> type[ServerCluster]:
    """:class:`ZooKeeperCluster` or :class:`EtcdCluster` for a backend name."""
    if backend in ("zookeeper", "zk"):
        return ZooKeeperCluster
    if backend == "etcd":
        return EtcdCluster
    raise ValueError(f"unknown backend {backend!r}; valid backends are zookeeper, etcd")


def iter_logs(cluster: ServerCluster) -> Iterator[Path]:
    """The server log path of every member (for attaching to failure reports)."""
    for m in cluster.members:
        yield m.log_path
