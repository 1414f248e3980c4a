"""A store that counts the calls made through the public contract, then delegates.

``round_trips`` of a backend counts *requests sent*, which on ZooKeeper includes
the pre-reads a commit needs for its conditions and the re-reads its tree watch
makes on the event thread. Wrapping the store handed to a Runtime counts what the
runtime *asked for* instead (a commit counts one, whatever it costs underneath),
so the benchmark can show both and where the difference comes from.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from shardkeeper.registry import batching
from shardkeeper.registry.base import (
    CommitResult,
    ConnectionState,
    CoordinationStore,
    GroupsResult,
    Node,
    Op,
    PathFilter,
    StateListener,
    Subscription,
    WatchListener,
)
from shardkeeper.registry.counting import request_count

__all__ = ["CountingStore"]


class CountingStore(CoordinationStore):
    """Delegates to ``inner``; :attr:`calls` counts reads and writes by kind."""

    def __init__(self, inner: CoordinationStore) -> None:
        self.inner = inner
        self.namespace = inner.namespace
        self.max_ops_per_commit = batching.max_ops_per_commit(inner)
        # the byte limit too: without it the runtime packed a 1,000-item completion
        # by count alone and the inner store refused it as too large
        self.max_commit_bytes = batching.max_commit_bytes(inner)
        # and whether it checks groups apart (etcd's nested transactions)
        self.max_groups_per_commit = batching.max_groups_per_commit(inner)
        self._lock = threading.Lock()
        #: calls per method name (get, exists, children, get_tree, put, create,
        #: delete, commit)
        self.calls: dict[str, int] = {}
        #: of the ``exists`` calls, those of an instance node: the runtime's liveness
        #: probe (one request every T/3, whatever the jobs do)
        self.probes = 0

    def commit_bytes(self, ops: Sequence[Op]) -> int:
        """The inner store's estimate (not counted: no request)."""
        return batching.commit_bytes(self.inner, ops)

    def _count(self, name: str) -> None:
        with self._lock:
            self.calls[name] = self.calls.get(name, 0) + 1

    @property
    def total_calls(self) -> int:
        """Every counted call so far."""
        with self._lock:
            return sum(self.calls.values())

    def start(self) -> None:
        """Start the inner store."""
        self.inner.start()

    def close(self) -> None:
        """Close the inner store."""
        self.inner.close()

    @property
    def session_id(self) -> str:
        """The inner store's session."""
        return self.inner.session_id

    @property
    def state(self) -> ConnectionState:
        """The inner store's state."""
        return self.inner.state

    @property
    def session_timeout(self) -> float:
        """The inner store's session timeout."""
        return self.inner.session_timeout

    def get(self, path: str) -> Node | None:
        """Counted delegate."""
        self._count("get")
        return self.inner.get(path)

    def exists(self, path: str) -> bool:
        """Counted delegate."""
        self._count("exists")
        if path.startswith("/instances/"):
            with self._lock:
                self.probes += 1
        return self.inner.exists(path)

    def children(self, path: str) -> list[str]:
        """Counted delegate."""
        self._count("children")
        return self.inner.children(path)

    def get_tree(self, path: str) -> dict[str, Node]:
        """Counted delegate."""
        self._count("get_tree")
        return self.inner.get_tree(path)

    def put(self, path: str, value: bytes, *, ephemeral: bool = False) -> Node:
        """Counted delegate."""
        self._count("put")
        return self.inner.put(path, value, ephemeral=ephemeral)

    def create(self, path: str, value: bytes = b"", *, ephemeral: bool = False) -> Node | None:
        """Counted delegate."""
        self._count("create")
        return self.inner.create(path, value, ephemeral=ephemeral)

    def delete(self, path: str, *, recursive: bool = True) -> None:
        """Counted delegate."""
        self._count("delete")
        self.inner.delete(path, recursive=recursive)

    def commit(self, ops: Sequence[Op]) -> CommitResult:
        """Counted delegate."""
        self._count("commit")
        return self.inner.commit(ops)

    def group_bytes(self, group: Sequence[Op]) -> int:
        """The inner store's estimate (not counted: no request)."""
        return batching.group_bytes(self.inner, group)

    def commit_groups(self, fixed: Sequence[Op], groups: Sequence[Sequence[Op]]) -> GroupsResult:
        """Counted delegate (one commit)."""
        self._count("commit")
        return batching.commit_groups(self.inner, fixed, groups)

    def watch(
        self, prefix: str, listener: WatchListener, *, exclude: PathFilter | None = None
    ) -> Subscription:
        """Delegate (not counted: a watch is set up once)."""
        return self.inner.watch(prefix, listener, exclude=exclude)

    def add_state_listener(self, listener: StateListener) -> Subscription:
        """Delegate."""
        return self.inner.add_state_listener(listener)

    @property
    def round_trips(self) -> int:
        """Requests the inner store has sent (its own counter: the wrapper, too,
        implements :class:`~shardkeeper.registry.counting.CountsRequests`)."""
        return request_count(self.inner)
