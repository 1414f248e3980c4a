"""Path helpers of the ZooKeeper backend and the znode -> ``Node`` mapping."""

from __future__ import annotations

from kazoo.protocol.states import ZnodeStat

from shardkeeper.registry.base import Node


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0] or "/"


def _child(path: str, name: str) -> str:
    return f"{path}/{name}" if path != "/" else f"/{name}"


def _node(path: str, value: bytes, stat: ZnodeStat) -> Node:
    return Node(
        path=path,
        value=value,
        version=stat.version,
        revision=stat.mzxid,
        created_revision=stat.czxid,
        ephemeral=stat.ephemeralOwner != 0,
    )
