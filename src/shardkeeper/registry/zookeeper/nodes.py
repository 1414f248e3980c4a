"""Path helpers of the ZooKeeper backend and the znode -> ``Node`` mapping."""

from __future__ import annotations

from kazoo.protocol.states import ZnodeStat

from shardkeeper.registry.base import Node, ancestors


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0] or "/"


def _child(path: str, name: str) -> str:
    return f"{path}/{name}" if path != "/" else f"/{name}"


def _ancestors(path: str) -> list[str]:
    """Proper ancestors of ``path`` below ``/``, top-down (``/a/b/c`` -> ``/a``, ``/a/b``):
    :func:`~shardkeeper.registry.base.ancestors` reversed (parents are made top-down)."""
    return ancestors(path)[::-1]


def _node(path: str, value: bytes, stat: ZnodeStat) -> Node:
    return Node(
        path=path,
        value=value,
        version=stat.version,
        revision=stat.mzxid,
        created_revision=stat.czxid,
        ephemeral=stat.ephemeralOwner != 0,
    )
