"""One member of a test cluster: its ports, directories, process and log
(:class:`Member`), and what a probe says it is doing (:class:`MemberStatus`).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardkeeper.testing.servers.processes import LOOPBACK, pid_alive

__all__ = ["Member", "MemberStatus"]


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
