"""Packing work into commits by the store's operation and byte limits
(``registry/packing.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from shardkeeper.registry import open_store
from shardkeeper.registry.base import Check, Create, Op
from shardkeeper.registry.memory import MemoryStore
from shardkeeper.registry.packing import pack_groups


@pytest.fixture
def store() -> Iterator[MemoryStore]:
    """An in-memory store whose limits each test sets (plain attributes on it)."""
    with open_store("memory://packing/ns") as s:
        assert isinstance(s, MemoryStore), "a memory:// URL opens the MemoryStore"
        yield s


def _groups(n: int, value: bytes = b"v") -> list[list[Op]]:
    return [[Check(f"/c/{i}", exists=False), Create(f"/m/{i}", value)] for i in range(n)]


def test_groups_are_cut_by_the_operation_limit_never_split(store: MemoryStore) -> None:
    """10 groups of 2 behind 2 fixed ops, 8 ops a commit: 3 groups a chunk."""
    store.max_ops_per_commit = 8
    fixed: list[Op] = [Check("/a", exists=False), Check("/b", exists=False)]
    chunks = pack_groups(store, _groups(10), fixed)
    assert [members for members, _ in chunks] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    for _, ops in chunks:
        assert ops[:2] == fixed
        assert len(ops) <= 8


def test_groups_are_cut_by_the_byte_limit(store: MemoryStore) -> None:
    """With a byte limit, a chunk holds what fits by size even when the count allows
    more; no chunk passes the limit."""
    store.max_ops_per_commit = 1000
    groups = _groups(20, b"x" * 300)
    per_group = store.commit_bytes(groups[0])
    store.max_commit_bytes = 4 * per_group + per_group // 2
    chunks = pack_groups(store, groups)
    assert [len(members) for members, _ in chunks] == [4, 4, 4, 4, 4]
    for _, ops in chunks:
        assert store.commit_bytes(ops) <= store.max_commit_bytes


def test_a_group_larger_than_a_commit_gets_one_of_its_own(store: MemoryStore) -> None:
    """An oversized group is not dropped or split: it gets a chunk alone (the store
    then refuses it, naming its limit); no groups gives the fixed ops alone."""
    store.max_commit_bytes = 500
    groups: list[list[Op]] = [*_groups(1), [Create("/big", b"x" * 1000)], *_groups(1)]
    assert [m for m, _ in pack_groups(store, groups)] == [[0], [1], [2]]
    fixed: list[Op] = [Check("/a", exists=True)]
    assert pack_groups(store, [], fixed) == [([], fixed)]
