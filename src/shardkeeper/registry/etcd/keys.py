"""How store paths map onto etcd's flat keyspace: keys, subtree ranges, pure parents.

Mapping onto etcd's flat keyspace
---------------------------------
* Node ``/a/b`` of namespace ``ns`` is the key ``/ns/a/b``; the root ``/`` is the
  key ``/ns/``. A ``/`` inside the namespace is escaped as ``%2F`` (namespace
  ``prod/orders`` -> ``/prod%2Forders/a/b``) so that namespace ``prod`` never sees
  ``prod/orders``. The subtree of a key ``K`` is the range ``[K + '/', K + '0')``
  (``'0'`` follows ``'/'`` in ASCII), so namespace ``a`` never sees ``ab`` and ``/x``
  never matches ``/xy``; the subtree of the root key ``/ns/`` is ``[/ns/ + '\0',
  /ns0)`` (see ``subtree``). So every key and range the store reads, writes, compares
  or watches lies inside the prefix ``/ns/``: an etcd role granted
  ``--prefix /ns/`` (which, unlike ``--prefix /ns``, does not also cover namespace
  ``nsX``) is all a user needs.
* Parents are implicit. A *pure parent* is a path with no key of its own but keys
  below it: ``exists`` is true, ``children`` lists it, ``get`` and ``get_tree``
  return it as a synthetic node ``Node(path, b"", version=0, revision=0,
  created_revision=0)``. It vanishes with its last descendant.
* ``Node.version`` and ``Node.revision`` are the key's ``mod_revision``,
  ``created_revision`` its ``create_revision``, ``ephemeral`` is ``lease != 0``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shardkeeper.registry.base import Node, check_path
from shardkeeper.registry.etcd.records import Range

__all__ = [
    "Keyspace",
    "below_op",
    "below_prefix",
    "below_range",
    "in_subtree",
    "own_range",
    "range_op",
    "subtree",
    "synthetic_node",
]


def range_op(key: bytes, *, keys_only: bool = False) -> Range:
    """A read of node key ``key`` itself."""
    return Range(key, keys_only=keys_only)


def below_op(key: bytes, *, keys_only: bool = False, limit: int = 0) -> Range:
    """A read of the keys strictly below node key ``key`` (at most ``limit``; 0: all)."""
    below, end = subtree(key)
    return Range(below, end, keys_only=keys_only, limit=limit)


def synthetic_node(path: str) -> Node:
    return Node(path, b"", 0, 0, 0, False)


def below_prefix(key: bytes) -> bytes:
    """What every key below node key ``key`` starts with: ``K/`` (the root key ``/ns/``
    is its own prefix)."""
    return key if key.endswith(b"/") else key + b"/"


def subtree(key: bytes) -> tuple[bytes, bytes]:
    """``(start, end)``: the etcd range of the keys strictly below node key ``key``.

    ``[K/, K0)`` for a node ``K``. The root's own key ``/ns/`` ends with the ``/`` that
    other keys lack (a path never does), and its subtree is every other key of the
    namespace: ``[/ns/ + '\0', /ns0)``. The end, ``K0``, is also where the range
    ``[K, end)`` of the node and its subtree stops; so nothing reaches outside the
    namespace prefix ``/ns/`` (see the module docstring)."""
    prefix = below_prefix(key)
    start = prefix + b"\0" if prefix == key else prefix
    return start, prefix[:-1] + b"0"


def in_subtree(key: bytes, other: bytes, *, own: bool = False) -> bool:
    """Whether ``other`` is a key strictly below node key ``key`` (or ``key`` itself
    when ``own``)."""
    start, end = subtree(key)
    return (own and other == key) or start <= other < end


def own_range(key: bytes) -> Range:
    """Whether node key ``key`` itself exists (its key only)."""
    return Range(key, keys_only=True)


def below_range(key: bytes) -> Range:
    """At most one key of the subtree ``[K + '/', K + '0')``: is anything below K?"""
    start, end = subtree(key)
    return Range(start, end, keys_only=True, limit=1)


@dataclass(frozen=True)
class Keyspace:
    """The keys of one namespace: paths to keys and back, and etcd's key-values to
    nodes (see the module docstring). Pure: every part of the store holds the same one.
    """

    #: the namespace's key prefix without its trailing ``/``: ``/ns`` (escaped)
    root: str

    @classmethod
    def of(cls, namespace: str) -> Keyspace:
        """The keyspace of ``namespace``: a ``/`` inside it is escaped so that
        namespace X never sees X/sub."""
        return cls("/" + namespace.strip("/").replace("/", "%2F"))

    def key(self, path: str) -> bytes:
        """The key of ``path`` (checked); the root's key ends with ``/`` so that it too
        lies inside the namespace prefix."""
        check_path(path)
        return (self.root + path).encode()

    def path(self, key: bytes) -> str:
        """The path of ``key``, a key of this namespace."""
        return key.decode()[len(self.root) :] or "/"

    def node(self, kv: Any) -> Node:
        """The node of an etcd ``KeyValue``."""
        return Node(
            path=self.path(kv.key),
            value=bytes(kv.value),
            version=int(kv.mod_revision),
            revision=int(kv.mod_revision),
            created_revision=int(kv.create_revision),
            ephemeral=kv.lease != 0,
        )
