"""Batching: an optional capability of a store, beside the coordination contract.

The contract (:class:`~shardkeeper.registry.base.CoordinationStore`) is coordination
only: a new backend, or a user's test double, implements it first and works. What a
large deployment also needs (thousands of jobs registering at once, a failover of
100,000 items) is to pack work into as few commits as the store takes, and to have
groups of a commit checked apart in one request. A store that can do that implements
:class:`BatchingStore`; callers never ask the store directly but call the functions of
this module, which check for the protocol (``isinstance``) and otherwise use what
every store can do: commits of at most :data:`DEFAULT_MAX_OPS` operations, no byte
limit, and ``commit_groups`` sent as one plain commit.

Every store of the project implements it:

* :class:`~shardkeeper.registry.zookeeper.ZooKeeperStore`: 4,096 operations and
  800,000 bytes a commit (jute.maxbuffer), groups in one plain multi;
* :class:`~shardkeeper.registry.etcd.EtcdStore`: the URL's ``max_txn_ops`` and
  1,400,000 bytes (``--max-request-bytes``), groups checked apart as nested
  transactions;
* :class:`~shardkeeper.registry.memory.MemoryStore`: 128 operations, its server's
  request limit, groups apart when its server says so.

The packing itself is :func:`shardkeeper.registry.packing.pack_groups`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from shardkeeper.registry.base import (
    CommitResult,
    CoordinationStore,
    Create,
    GroupsResult,
    Op,
    Put,
)

__all__ = [
    "DEFAULT_MAX_OPS",
    "OP_FRAMING_BYTES",
    "BatchingStore",
    "commit_bytes",
    "commit_groups",
    "default_commit_bytes",
    "group_bytes",
    "max_commit_bytes",
    "max_groups_per_commit",
    "max_ops_per_commit",
    "plain_commit_groups",
]

#: the operations one commit of a store without :class:`BatchingStore` is assumed to
#: take (etcd's default ``--max-txn-ops``, the lowest of the project's stores)
DEFAULT_MAX_OPS = 128

#: bytes an operation of a commit takes besides its path and value, as
#: :func:`default_commit_bytes` counts them (a header, lengths, flags and an ACL or
#: compares)
OP_FRAMING_BYTES = 96


@runtime_checkable
class BatchingStore(Protocol):
    """A store that says how much one commit takes and can check groups apart."""

    @property
    def max_ops_per_commit(self) -> int:
        """The most operations one :meth:`~CoordinationStore.commit` carries; more
        raise StoreLimitError."""
        ...

    @property
    def max_commit_bytes(self) -> int | None:
        """The largest :meth:`commit_bytes` one commit may have (None: no limit
        besides the operation count); a larger commit raises StoreLimitError before
        anything is sent."""
        ...

    @property
    def max_groups_per_commit(self) -> int | None:
        """How many groups one :meth:`commit_groups` carries when the store checks
        them apart (etcd: nested transactions); None when the groups go into one plain
        commit, whose :attr:`max_ops_per_commit` then bounds their operations."""
        ...

    def commit_bytes(self, ops: Sequence[Op]) -> int:
        """The size of a commit of ``ops`` as this store counts it against
        :attr:`max_commit_bytes`."""
        ...

    def group_bytes(self, group: Sequence[Op]) -> int:
        """What one group of :meth:`commit_groups` adds to its request, as counted
        against :attr:`max_commit_bytes`."""
        ...

    def commit_groups(self, fixed: Sequence[Op], groups: Sequence[Sequence[Op]]) -> GroupsResult:
        """One commit of ``fixed`` and ``groups``: nothing is applied unless every
        check of ``fixed`` holds; each group is applied with its own checks, all or
        nothing.

        A store that sends one plain commit (:func:`plain_commit_groups`) refuses the
        whole commit on one failed check of a group (``succeeded`` False). A store that
        checks groups apart (:attr:`max_groups_per_commit` set) applies every group
        whose checks hold and reports the others in ``refused``: callers handle both.
        Limits and errors are those of :meth:`~CoordinationStore.commit`."""
        ...


def default_commit_bytes(ops: Sequence[Op]) -> int:
    """A commit's size counted as values, paths and :data:`OP_FRAMING_BYTES` each."""
    return sum(
        len(op.path) + OP_FRAMING_BYTES + (len(op.value) if isinstance(op, Create | Put) else 0)
        for op in ops
    )


def plain_commit_groups(
    store: CoordinationStore, fixed: Sequence[Op], groups: Sequence[Sequence[Op]]
) -> GroupsResult:
    """``commit_groups`` as one plain :meth:`~CoordinationStore.commit` of everything:
    one failed check refuses the whole commit (ZooKeeper's way, and every store's
    without :class:`BatchingStore`)."""
    result: CommitResult = store.commit([*fixed, *(op for group in groups for op in group)])
    if not result:
        return GroupsResult(False, failed_path=result.failed_path)
    return GroupsResult(True, result.revision, dict.fromkeys(range(len(groups)), result.revision))


def max_ops_per_commit(store: CoordinationStore) -> int:
    """The store's :attr:`BatchingStore.max_ops_per_commit`, else :data:`DEFAULT_MAX_OPS`."""
    return store.max_ops_per_commit if isinstance(store, BatchingStore) else DEFAULT_MAX_OPS


def max_commit_bytes(store: CoordinationStore) -> int | None:
    """The store's :attr:`BatchingStore.max_commit_bytes`, else None (no byte limit)."""
    return store.max_commit_bytes if isinstance(store, BatchingStore) else None


def max_groups_per_commit(store: CoordinationStore) -> int | None:
    """The store's :attr:`BatchingStore.max_groups_per_commit`, else None (plain commits)."""
    return store.max_groups_per_commit if isinstance(store, BatchingStore) else None


def commit_bytes(store: CoordinationStore, ops: Sequence[Op]) -> int:
    """The store's :meth:`BatchingStore.commit_bytes`, else :func:`default_commit_bytes`."""
    if isinstance(store, BatchingStore):
        return store.commit_bytes(ops)
    return default_commit_bytes(ops)


def group_bytes(store: CoordinationStore, group: Sequence[Op]) -> int:
    """The store's :meth:`BatchingStore.group_bytes`, else :func:`default_commit_bytes`."""
    if isinstance(store, BatchingStore):
        return store.group_bytes(group)
    return default_commit_bytes(group)


def commit_groups(
    store: CoordinationStore, fixed: Sequence[Op], groups: Sequence[Sequence[Op]]
) -> GroupsResult:
    """The store's :meth:`BatchingStore.commit_groups`, else :func:`plain_commit_groups`."""
    if isinstance(store, BatchingStore):
        return store.commit_groups(fixed, groups)
    return plain_commit_groups(store, fixed, groups)
