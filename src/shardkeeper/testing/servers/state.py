"""The saved state of a detached cluster (the ``registry up``/``down``/``status``
commands): describing a running cluster, and re-attaching to its processes later.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardkeeper.testing.servers.members import Member
from shardkeeper.testing.servers.processes import (
    LOOPBACK,
    _proc_cmdline,
    _proc_state,
    pid_alive,
)

if TYPE_CHECKING:
    from shardkeeper.testing.servers.base import ServerCluster

__all__ = ["attach", "cluster_state"]


def cluster_state(cluster: ServerCluster) -> dict[str, Any]:
    """A JSON-friendly description of ``cluster`` from which :func:`attach` re-attaches."""
    return {
        "backend": cluster.backend,
        "size": cluster.size,
        "base_dir": str(cluster.base_dir),
        "extra": cluster._extra_state(),
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
            for m in cluster.members
        ],
    }


def attach(state: Mapping[str, Any]) -> ServerCluster:
    """Re-attach to processes described by :func:`cluster_state` (not our children).

    A pid is only trusted if that process's command line still names the member's
    directory, so a recycled pid is never killed by mistake.
    """
    # the backends import the base class, which imports this module: import them late
    from shardkeeper.testing.servers.etcd import EtcdCluster
    from shardkeeper.testing.servers.zookeeper import ZooKeeperCluster

    cls: type[ServerCluster] = ZooKeeperCluster if state["backend"] == "zookeeper" else EtcdCluster
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
