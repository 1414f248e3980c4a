"""shardkeeper: elastic sharded job coordination for Python services on ZooKeeper or etcd."""

from __future__ import annotations

__version__ = "0.1.0"
