"""Test support for shardkeeper users and its own suite (like ``kazoo.testing``).

* :mod:`shardkeeper.testing.servers`: real ZooKeeper and etcd processes on free
  loopback ports (:class:`ZooKeeperCluster`, :class:`EtcdCluster`) with per-member
  kill/pause/resume/restart.
* :mod:`shardkeeper.testing.faults`: :func:`expire_session` (server-side) and
  :func:`wait_until` (poll a condition with a deadline).
* :mod:`shardkeeper.testing.local`: detached local registries (``up``/``down``/
  ``status``), also as ``python -m shardkeeper.testing``.
"""

from __future__ import annotations

from shardkeeper.testing.faults import expire_session, wait_until
from shardkeeper.testing.servers import (
    ClusterError,
    EtcdCluster,
    MemberStatus,
    ServerCluster,
    ZooKeeperCluster,
    cluster_class,
)

__all__ = [
    "ClusterError",
    "EtcdCluster",
    "MemberStatus",
    "ServerCluster",
    "ZooKeeperCluster",
    "cluster_class",
    "expire_session",
    "wait_until",
]
