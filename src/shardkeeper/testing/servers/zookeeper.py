"""Real ZooKeeper servers for tests: :class:`ZooKeeperCluster` (standalone or
ensemble) and the four-letter-word probes that tell whether a member serves.

With ``tls=`` (a :class:`~shardkeeper.testing.certs.TLSFiles`) each member also serves
a ``secureClientPort`` through Netty, with PEM key and trust stores (ZooKeeper 3.8
reads PEM with ``ssl.keyStore.type=PEM``), requiring a client certificate unless
``client_auth="none"``. Clients (:attr:`ZooKeeperCluster.hosts`, :meth:`url`) then
dial the secure port; the plaintext ``clientPort`` stays open on loopback for the
four-letter-word readiness probes only.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from shardkeeper.testing.servers.base import ServerCluster
from shardkeeper.testing.servers.locate import find_java, find_zookeeper
from shardkeeper.testing.servers.members import Member
from shardkeeper.testing.servers.processes import LOOPBACK, Backend, ClusterError, free_ports

if TYPE_CHECKING:
    from shardkeeper.testing.certs import TLSFiles

__all__ = ["ZOOKEEPER_CLASSPATH", "ZooKeeperCluster", "four_letter_word", "zookeeper_mode"]

#: Where Debian puts ZooKeeper (the servers run the installation that
#: :func:`~shardkeeper.testing.servers.locate.find_zookeeper` finds: an environment
#: variable, a zkServer.sh on the PATH, then this); the jar's manifest pulls its own
#: dependencies, but the slf4j binding must be on the class path or the server logs
#: nothing at all.
ZOOKEEPER_CLASSPATH = (
    "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-api.jar:/usr/share/java/slf4j-simple.jar"
)
#: what Debian's Netty connection factory (needed for TLS) loads beyond the manifest
NETTY_CLASSPATH = "/usr/share/java/netty-codec.jar:/usr/share/java/netty-resolver.jar"


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


#: the heap cap of a test server's JVM (MB). Measured (bench/zk_heap.py,
#: docs/registry-backends.md#sizing-the-store): a server keeps its last 500-700
#: transactions in memory (``zookeeper.commitLogCount``, which it will not lower), so
#: a job of 6,000 items every 3 s on 2 instances, whose commits are multis of up to
#: 1 MB, holds 430-490 MB live; 96 MB died of OutOfMemoryError and 512 MB ran full.
#: The JVM starts at 16 MB and grows only as used: a test with small commits costs
#: no more than before.
TEST_HEAP_MB = 1024

#: the heap cap of ``shardkeeper registry up``'s servers (MB): room for the last 700
#: transactions at ZooKeeper's request limit (about 1 MB each, kept as bytes and as
#: objects: about 1.3 GB) besides the tree, so no job the runtime accepts exhausts it
REGISTRY_HEAP_MB = 2048


class ZooKeeperCluster(ServerCluster):
    """A real ZooKeeper 3.8 standalone server (``size=1``) or ensemble (``size=3``).

    Runs ``java -Xmx1024m ... QuorumPeerMain zoo.cfg`` per member with tickTime=200 and
    sessions allowed from 0.4 s to 60 s. ``heap_mb`` caps each JVM's heap (default
    :data:`TEST_HEAP_MB`). ``tls``:
    serve clients over TLS with these certificates (see the module docstring);
    ``client_auth``: ``"need"`` (default) a client certificate, or ``"none"``.
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
        heap_mb: int = TEST_HEAP_MB,
        tick_ms: int = 200,
        host: str | Sequence[str] = LOOPBACK,
        prefixes: Sequence[Sequence[str]] | None = None,
        tls: TLSFiles | None = None,
        client_auth: Literal["need", "none"] = "need",
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
        if client_auth not in ("need", "none"):
            raise ValueError(f"client_auth must be 'need' or 'none', not {client_auth!r}")
        #: the certificates of the TLS port (None: plaintext only)
        self.tls = tls
        self.client_auth = client_auth
        #: the secure client port of each member (with ``tls``)
        self.secure_ports: list[int] = []

    @property
    def hosts(self) -> list[tuple[str, int]]:
        """``(host, port)`` clients dial: the secure client ports with ``tls``."""
        if self.tls is None:
            return super().hosts
        return [(m.host, p) for m, p in zip(self.members, self.secure_ports, strict=True)]

    def url(self, namespace: str = "default", **options: float | str | None) -> str:
        """A registry URL on this cluster; with ``tls`` it carries ``ca``, ``cert`` and
        ``key`` (the client certificate), each replaceable or, given None, left out."""
        if self.tls is not None:
            options = {**self.tls.url_options(), **options}
        return super().url(namespace, **options)

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
        if self.tls is not None and self.secure_ports:
            tls = self.tls
            lines += [
                f"secureClientPort={self.secure_ports[m.index]}",
                f"secureClientPortAddress={m.host}",
                # the NIO factory has no TLS; Netty's also serves the plaintext port
                "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
                # ZooKeeper 3.8 reads PEM directly: the key followed by its certificate
                f"ssl.keyStore.location={tls.server_bundle}",
                "ssl.keyStore.type=PEM",
                f"ssl.trustStore.location={tls.ca}",
                "ssl.trustStore.type=PEM",
                f"ssl.clientAuth={self.client_auth}",
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
        # both looked up at each launch: a missing one says what to install, before a
        # JVM fails with ClassNotFoundException
        install = find_zookeeper()
        java = find_java()
        classpath = install.classpath + (install.netty if self.tls is not None else ())
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
            os.pathsep.join(classpath),
            "org.apache.zookeeper.server.quorum.QuorumPeerMain",
            str(m.base_dir / "zoo.cfg"),
        ]

    def _prepare_members(self) -> None:
        self.secure_ports = []  # chosen once the other ports are (below)
        super()._prepare_members()
        if self.tls is None:
            return
        taken = {p for m in self.members for p in (m.client_port, m.peer_port, m.election_port)}
        spare = [p for p in free_ports(4 * self.size) if p not in taken]
        self.secure_ports = spare[: self.size]
        for m in self.members:  # the config written by super() lacked the secure port
            self._write_config(m)

    def _extra_state(self) -> dict[str, Any]:
        # the heap too: a member restarted by an attached copy gets the same one
        if self.tls is None:
            return {"heap_mb": self.heap_mb}
        return {
            "heap_mb": self.heap_mb,
            "tls_dir": str(self.tls.ca.parent),
            "client_auth": self.client_auth,
            "secure_ports": self.secure_ports,
        }

    def _load_extra_state(self, extra: Mapping[str, Any]) -> None:
        self.heap_mb = int(extra.get("heap_mb") or self.heap_mb)
        if extra.get("tls_dir"):
            from shardkeeper.testing.certs import load_certificates

            self.tls = load_certificates(Path(str(extra["tls_dir"])))
            self.client_auth = "none" if extra.get("client_auth") == "none" else "need"
            self.secure_ports = [int(p) for p in extra.get("secure_ports") or []]

    def _probe(self, m: Member) -> str:
        return zookeeper_mode(m.host, m.client_port, timeout=0.5)

    def _cluster_ready(self) -> bool:
        if self.size == 1:
            return True
        modes = [self._probe(m) for m in self.members if m.alive() and not m.paused]
        return modes.count("leader") == 1
