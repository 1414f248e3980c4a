"""Real ZooKeeper servers for tests: :class:`ZooKeeperCluster` (standalone or
ensemble) and the four-letter-word probes that tell whether a member serves.
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Sequence
from typing import ClassVar

from shardkeeper.testing.servers.base import ServerCluster
from shardkeeper.testing.servers.members import Member
from shardkeeper.testing.servers.processes import LOOPBACK, Backend, ClusterError

__all__ = ["ZOOKEEPER_CLASSPATH", "ZooKeeperCluster", "four_letter_word", "zookeeper_mode"]

#: Where Debian puts ZooKeeper; the jar's manifest pulls its own dependencies, but the
#: slf4j binding must be on the class path or the server logs nothing at all.
ZOOKEEPER_CLASSPATH = (
    "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-api.jar:/usr/share/java/slf4j-simple.jar"
)


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
