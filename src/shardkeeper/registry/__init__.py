"""The coordination-store layer: one contract (``base``), two backends, URL settings.

``open_store(url)`` builds the right backend for a registry URL without connecting
(``memory://name/ns``: the in-process reference store of ``memory/``);
call ``start()`` (or use it as a context manager) to connect.
"""

from __future__ import annotations

from shardkeeper.errors import ConfigError
from shardkeeper.registry.base import (
    Check,
    CommitResult,
    ConnectionState,
    CoordinationStore,
    Create,
    Delete,
    EventKind,
    Node,
    Op,
    Put,
    Subscription,
    WatchEvent,
)
from shardkeeper.registry.url import ENV_VAR, RegistrySettings, parse_registry_url

__all__ = [
    "ENV_VAR",
    "Check",
    "CommitResult",
    "ConnectionState",
    "CoordinationStore",
    "Create",
    "Delete",
    "EventKind",
    "Node",
    "Op",
    "Put",
    "RegistrySettings",
    "Subscription",
    "WatchEvent",
    "open_store",
    "parse_registry_url",
]


def open_store(url: str | RegistrySettings | None = None) -> CoordinationStore:
    """Build (without connecting) the store for a registry URL or settings.

    ``None`` reads the ``SHARDKEEPER_REGISTRY`` environment variable.
    """
    settings = url if isinstance(url, RegistrySettings) else RegistrySettings.from_env(url)
    if settings.backend == "memory":
        from shardkeeper.registry.memory import MemoryStore, named_server

        return MemoryStore(
            named_server(settings.hosts[0][0]),
            settings.namespace,
            session_timeout=settings.session_timeout,
        )
    if settings.backend == "zookeeper":
        from shardkeeper.registry.zookeeper import ZooKeeperStore

        return ZooKeeperStore(settings)
    try:
        from shardkeeper.registry.etcd import EtcdStore
    except ImportError as exc:
        if exc.name not in ("etcd3", "grpc", "google", "google.protobuf"):
            raise
        raise ConfigError(
            f"etcd:// registry URLs need the etcd extra ({exc.name} is not installed): "
            "pip install 'shardkeeper[etcd]'"
        ) from None

    return EtcdStore(settings)
