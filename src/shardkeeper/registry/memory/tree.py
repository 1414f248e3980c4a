"""The data of the in-memory store: one namespace's tree and the commit conditions.

Model (the stricter choice wherever the real backends differ)
-------------------------------------------------------------
* Parents are implicit as in etcd: a *pure parent* has no node of its own;
  ``exists`` is true, ``children`` lists it, ``get``/``get_tree`` return it as a
  synthetic ``Node(path, b"", version=0, revision=0, created_revision=0)`` and it
  produces no watch event. It vanishes with its last descendant.
* Every write call (``put``, ``create``, ``delete``, ``commit``, a session's end) is
  one transaction with one new store-wide revision. ``Node.version`` and
  ``Node.revision`` are the revision of the node's last write (so a version never
  repeats, even across a delete and re-create); ``created_revision`` is the revision
  of its creation (a Delete and a Create of one path in one commit make a new
  incarnation).
* Checks of a commit see the state before the commit. ``Check(version/value/
  created_revision)`` look at the node's own record: a pure parent never passes them.
  A ``Create`` after a write of the same path in one commit fails the commit.
* An ephemeral node cannot have children: a write below one, or making a node with
  children ephemeral, raises StoreError and applies nothing. ``delete(path,
  recursive=False)`` of a node with children raises StoreError (as ZooKeeper does);
  a ``Delete`` inside a commit removes only the node's own record.
* Values: at most ``max_request_bytes`` (default 1,000,000, ZooKeeper's limit) of
  values per request, else StoreLimitError; at most 128 operations per commit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shardkeeper.errors import ConfigError, StoreError, StoreLimitError
from shardkeeper.registry.base import (
    Check,
    Create,
    Delete,
    Node,
    Op,
    Put,
    ancestors,
    check_path,
)


def _under(path: str, prefix: str) -> bool:
    """Segment-wise prefix: ``/a`` covers ``/a`` and ``/a/x``, not ``/ab``."""
    return prefix == "/" or path == prefix or path.startswith(prefix + "/")


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0] or "/"


# ---- the data ---------------------------------------------------------------------------


@dataclass
class _Rec:
    """A node's own record (pure parents have none)."""

    value: bytes
    revision: int
    created_revision: int
    owner: int  # session id of an ephemeral node, 0 for a persistent one


class _Tree:
    """One namespace: records by path plus the index that makes parents implicit."""

    def __init__(self) -> None:
        self.nodes: dict[str, _Rec] = {}
        #: path -> number of records at or below it (present iff > 0)
        self.weight: dict[str, int] = {}
        #: path -> names of its children that are present
        self.kids: dict[str, set[str]] = {}

    def exists(self, path: str) -> bool:
        return self.weight.get(path, 0) > 0

    def node(self, path: str) -> Node | None:
        rec = self.nodes.get(path)
        if rec is not None:
            return Node(
                path, rec.value, rec.revision, rec.revision, rec.created_revision, rec.owner != 0
            )
        if self.exists(path):
            return Node(path, b"", 0, 0, 0)
        return None

    def children(self, path: str) -> list[str]:
        return sorted(self.kids.get(path, ()))

    def subtree(self, path: str) -> list[str]:
        """Every present path at or below ``path``, parents before children."""
        if not self.exists(path):
            return []
        out: list[str] = []
        todo = [path]
        while todo:
            p = todo.pop()
            out.append(p)
            base = "" if p == "/" else p
            todo.extend(f"{base}/{name}" for name in sorted(self.kids.get(p, ()), reverse=True))
        return out

    def has_descendants(self, path: str) -> bool:
        return self.weight.get(path, 0) > (1 if path in self.nodes else 0)

    def set(self, path: str, rec: _Rec) -> None:
        if path not in self.nodes:
            self._count(path, +1)
        self.nodes[path] = rec

    def remove(self, path: str) -> _Rec | None:
        rec = self.nodes.pop(path, None)
        if rec is not None:
            self._count(path, -1)
        return rec

    def _count(self, path: str, delta: int) -> None:
        # the path, its ancestors and the root: each counts what lives at or below it
        for p in (path, *ancestors(path), "/") if path != "/" else ("/",):
            w = self.weight.get(p, 0) + delta
            if w > 0:
                self.weight[p] = w
            else:
                self.weight.pop(p, None)
            if p == "/":
                continue
            # a path appears in its parent's listing with its first record and
            # leaves it with its last (delta is +1 or -1)
            if delta > 0 and w == 1:
                self.kids.setdefault(_parent(p), set()).add(p.rsplit("/", 1)[1])
            elif w == 0:
                names = self.kids.get(_parent(p), set())
                names.discard(p.rsplit("/", 1)[1])
                if not names:
                    self.kids.pop(_parent(p), None)


def _holds(tree: _Tree, check: Check) -> bool:
    """Whether ``check`` is true on ``tree`` now."""
    if check.exists is not None:
        return tree.exists(check.path) is check.exists
    rec = tree.nodes.get(check.path)
    if rec is None:
        return False
    if check.version is not None:
        return rec.revision == check.version
    if check.value is not None:
        return rec.value == check.value
    return rec.created_revision == check.created_revision


def _guard_ephemerals(tree: _Tree, final: dict[str, tuple[bytes, bool] | None]) -> None:
    """Raise StoreError when the commit would leave an ephemeral node with children."""

    def ephemeral_after(path: str) -> bool:
        if path in final:
            write = final[path]
            return write is not None and write[1]
        rec = tree.nodes.get(path)
        return rec is not None and rec.owner != 0

    for path, write in final.items():
        if write is None:
            continue
        for ancestor in ancestors(path):  # (the root is never ephemeral)
            if ephemeral_after(ancestor):
                raise StoreError(
                    f"cannot write {path!r}: {ancestor!r} is ephemeral and an ephemeral "
                    "node cannot have children"
                )
        if write[1] and tree.has_descendants(path):
            below = [p for p in tree.subtree(path)[1:] if p in tree.nodes]
            if any(final.get(p, (b"", False)) is not None for p in below):
                raise StoreError(
                    f"cannot make {path!r} ephemeral: it has children and an ephemeral "
                    "node cannot have children"
                )


def _validate(what: str, ops: Sequence[Op], max_request_bytes: int) -> None:
    """Refuse bad operations, and values over ``max_request_bytes`` in total."""
    size = 0
    for op in ops:
        check_path(op.path)
        if isinstance(op, Create | Put):
            if not isinstance(op.value, bytes):
                raise ConfigError(
                    f"{what} {op.path}: value must be bytes, got {type(op.value).__name__}"
                )
            size += len(op.value)
            if op.ephemeral and op.path == "/":
                raise ConfigError("the namespace root '/' cannot be ephemeral")
        elif not isinstance(op, Check | Delete):
            raise ConfigError(f"unknown commit operation {op!r}")
    if size > max_request_bytes:
        raise StoreLimitError(
            f"{what}: {size} bytes of values exceed the request limit; keep values "
            f"under {max_request_bytes} bytes in total"
        )
