"""Test support for shardkeeper users and its own suite (like ``kazoo.testing``).

* :mod:`shardkeeper.testing.memory`: the reference in-memory store for tests of one
  process (:func:`memory_registry` gives a ``memory://`` URL on a server of the test's
  own; :class:`MemoryServer`, :class:`MemoryStore`): no server, no Java.
* :mod:`shardkeeper.testing.servers`: real ZooKeeper and etcd processes on free
  loopback ports (:class:`ZooKeeperCluster`, :class:`EtcdCluster`) with per-member
  kill/pause/resume/restart.
* :mod:`shardkeeper.testing.faults`: :func:`expire_session` (server-side) and
  :func:`wait_until` (poll a condition with a deadline).
* :mod:`shardkeeper.testing.netns`: network partitions: :class:`NetworkLab` runs
  instances and store members in Linux network namespaces on a private bridge, cuts
  an instance off (:meth:`Netns.cut`/:meth:`Netns.heal`) or a store member from its
  peers (:meth:`NetworkLab.isolate`/:meth:`NetworkLab.rejoin`). Needs root and
  ``ip``; :func:`unavailable_reason` says why not.
* :mod:`shardkeeper.testing.proxy`: a slow network: :class:`SlowProxy`, a userspace
  TCP proxy adding delay and stalls, switched on and off while connections run.
* :mod:`shardkeeper.testing.postgres`: a throwaway PostgreSQL server
  (:class:`~shardkeeper.testing.postgres.PostgresServer`) for the history tests.
* :mod:`shardkeeper.testing.jobs`: :class:`RecordingJob`, a job that records each
  execution's context (thread-safe) and waits for a condition with a deadline.
* :mod:`shardkeeper.testing.pytest_plugin`: pytest fixtures (a real ZooKeeper or etcd
  per session, a namespace per test, a registry URL), loaded automatically through
  the ``pytest11`` entry point when shardkeeper is installed.

The detached local registry behind ``shardkeeper registry up|down|status`` is a
product module, :mod:`shardkeeper.localregistry`.
"""

from __future__ import annotations

from shardkeeper.testing.faults import expire_session, wait_until
from shardkeeper.testing.jobs import RecordingJob, Run
from shardkeeper.testing.memory import MemoryServer, MemoryStore, memory_registry, named_server
from shardkeeper.testing.netns import Netns, NetworkLab, unavailable_reason
from shardkeeper.testing.proxy import SlowProxy, slow_proxies
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
    "MemoryServer",
    "MemoryStore",
    "Netns",
    "NetworkLab",
    "RecordingJob",
    "Run",
    "ServerCluster",
    "SlowProxy",
    "ZooKeeperCluster",
    "cluster_class",
    "expire_session",
    "memory_registry",
    "named_server",
    "slow_proxies",
    "unavailable_reason",
    "wait_until",
]
