"""Real ZooKeeper and etcd servers on loopback, for tests and local development.

:class:`ZooKeeperCluster` and :class:`EtcdCluster` launch 1 or 3 real server processes
(the etcd, ZooKeeper and java found on the ``PATH``, through ``SHARDKEEPER_ETCD``,
``SHARDKEEPER_ZOOKEEPER_HOME`` and ``JAVA_HOME``, or at Debian's paths: see
:mod:`~shardkeeper.testing.servers.locate`) on free loopback ports, wait until they
really serve, and give tests per-member fault injection::

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

The package, by role: ``processes`` (free ports, /proc probes, launching and killing a
member's process group, :class:`ClusterError`), ``members`` (:class:`Member`,
:class:`MemberStatus`), ``base`` (:class:`ServerCluster`), ``state`` (saving and
re-attaching detached clusters), ``locate`` (where the server programs are, and what to
install when one is missing), ``zookeeper`` and ``etcd`` (the two backends). Every
public name is re-exported here.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from shardkeeper.testing.servers.base import ServerCluster
from shardkeeper.testing.servers.etcd import (
    ETCD_BINARY,
    ETCDCTL_BINARY,
    EtcdCluster,
    etcd_health,
)
from shardkeeper.testing.servers.locate import (
    ServerNotFoundError,
    find_etcd,
    find_etcdctl,
    find_java,
    find_zookeeper,
)
from shardkeeper.testing.servers.members import Member, MemberStatus
from shardkeeper.testing.servers.processes import (
    LOOPBACK,
    Backend,
    ClusterError,
    free_ports,
    pid_alive,
)
from shardkeeper.testing.servers.zookeeper import (
    ZOOKEEPER_CLASSPATH,
    ZooKeeperCluster,
    four_letter_word,
    zookeeper_mode,
)

__all__ = [
    "ETCDCTL_BINARY",
    "ETCD_BINARY",
    "LOOPBACK",
    "ZOOKEEPER_CLASSPATH",
    "Backend",
    "ClusterError",
    "EtcdCluster",
    "Member",
    "MemberStatus",
    "ServerCluster",
    "ServerNotFoundError",
    "ZooKeeperCluster",
    "cluster_class",
    "etcd_health",
    "find_etcd",
    "find_etcdctl",
    "find_java",
    "find_zookeeper",
    "four_letter_word",
    "free_ports",
    "iter_logs",
    "pid_alive",
    "zookeeper_mode",
]


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
