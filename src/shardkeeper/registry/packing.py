"""Cutting a large piece of work into commits the store accepts.

A commit is atomic, but a store takes only so much in one: at most
:attr:`~shardkeeper.registry.batching.BatchingStore.max_ops_per_commit` operations and,
where the backend has a request-size limit, at most
:attr:`~shardkeeper.registry.batching.BatchingStore.max_commit_bytes` as
:meth:`~shardkeeper.registry.batching.BatchingStore.commit_bytes` counts them (a store
without :class:`~shardkeeper.registry.batching.BatchingStore` gets the defaults of
``batching.py``). Work that
is atomic per *group* of operations (one item's mark and its check, one job's
registration) is packed here into as few commits as both limits allow, never splitting
a group.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from shardkeeper.registry import batching
from shardkeeper.registry.base import CoordinationStore, Op

__all__ = ["pack_groups"]


def pack_groups(
    store: CoordinationStore,
    groups: Sequence[Sequence[Op]],
    fixed: Sequence[Op] = (),
    *,
    apart: bool = False,
) -> list[tuple[list[int], list[Op]]]:
    """Chunks of whole ``groups``, each led by the ``fixed`` operations, within the
    store's operation and byte limits. Returns (group indexes, operations) per chunk;
    no groups gives one chunk of the fixed operations alone. A group too large for a
    commit of its own still gets one (the store then refuses it, naming the limit).

    ``apart``: the chunks are for :func:`~shardkeeper.registry.batching.commit_groups`;
    on a store that checks groups apart (``max_groups_per_commit``) a chunk holds that
    many groups, whatever their operations add up to, within the byte limit."""
    room_ops = max(1, batching.max_ops_per_commit(store) - len(fixed))
    many = batching.max_groups_per_commit(store) if apart else None
    limit = batching.max_commit_bytes(store)
    room_bytes = None if limit is None else limit - batching.commit_bytes(store, fixed)
    # the protocol asked once, not per group: a pack holds thousands of groups
    measure: Callable[[Sequence[Op]], int] = batching.default_commit_bytes
    if isinstance(store, batching.BatchingStore):
        measure = store.group_bytes if many is not None else store.commit_bytes
    chunks: list[tuple[list[int], list[Op]]] = []
    members: list[int] = []
    ops: list[Op] = []
    size = 0
    for n, group in enumerate(groups):
        weight = 0 if room_bytes is None else measure(group)
        over_ops = len(members) >= many if many is not None else len(ops) + len(group) > room_ops
        over_bytes = room_bytes is not None and size + weight > room_bytes
        if members and (over_ops or over_bytes):
            chunks.append((members, [*fixed, *ops]))
            members, ops, size = [], [], 0
        members.append(n)
        ops.extend(group)
        size += weight
    if members or not chunks:
        chunks.append((members, [*fixed, *ops]))
    return chunks
