"""Batching is optional (registry/batching.py): the small contract alone works.

A store that implements only :class:`CoordinationStore` (a new backend, a user's test
double) gets plain commits of at most ``DEFAULT_MAX_OPS`` operations, no byte limit and
``commit_groups`` as one plain commit; the project's stores implement
:class:`BatchingStore` with their own limits."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

from shardkeeper.registry import batching, open_store
from shardkeeper.registry.base import (
    Check,
    CommitResult,
    ConnectionState,
    CoordinationStore,
    Node,
    Op,
    PathFilter,
    Put,
    StateListener,
    Subscription,
    WatchListener,
)
from shardkeeper.registry.memory import MemoryStore
from shardkeeper.registry.packing import pack_groups


class SmallStore(CoordinationStore):
    """Only the contract, over a MemoryStore: what a user's double would be."""

    def __init__(self, inner: CoordinationStore) -> None:
        self.inner = inner
        self.namespace = inner.namespace
        self.commits: list[list[Op]] = []

    def start(self) -> None:
        self.inner.start()

    def close(self) -> None:
        self.inner.close()

    @property
    def session_id(self) -> str:
        return self.inner.session_id

    @property
    def state(self) -> ConnectionState:
        return self.inner.state

    @property
    def session_timeout(self) -> float:
        return self.inner.session_timeout

    def get(self, path: str) -> Node | None:
        return self.inner.get(path)

    def exists(self, path: str) -> bool:
        return self.inner.exists(path)

    def children(self, path: str) -> list[str]:
        return self.inner.children(path)

    def get_tree(self, path: str) -> dict[str, Node]:
        return self.inner.get_tree(path)

    def put(self, path: str, value: bytes, *, ephemeral: bool = False) -> Node:
        return self.inner.put(path, value, ephemeral=ephemeral)

    def create(self, path: str, value: bytes = b"", *, ephemeral: bool = False) -> Node | None:
        return self.inner.create(path, value, ephemeral=ephemeral)

    def delete(self, path: str, *, recursive: bool = True) -> None:
        self.inner.delete(path, recursive=recursive)

    def commit(self, ops: Sequence[Op]) -> CommitResult:
        self.commits.append(list(ops))
        return self.inner.commit(ops)

    def watch(
        self, prefix: str, listener: WatchListener, *, exclude: PathFilter | None = None
    ) -> Subscription:
        return self.inner.watch(prefix, listener, exclude=exclude)

    def add_state_listener(self, listener: StateListener) -> Subscription:
        return self.inner.add_state_listener(listener)


@pytest.fixture
def small() -> Iterator[SmallStore]:
    """A started contract-only store."""
    with open_store("memory://batching/ns") as inner:
        store = SmallStore(inner)
        yield store


def test_a_contract_only_store_is_no_batching_store_and_gets_the_defaults(
    small: SmallStore,
) -> None:
    """The functions fall back to the defaults: 128 operations, no byte limit, plain
    commits, the default byte count."""
    assert not isinstance(small, batching.BatchingStore)
    assert batching.max_ops_per_commit(small) == batching.DEFAULT_MAX_OPS == 128
    assert batching.max_commit_bytes(small) is None
    assert batching.max_groups_per_commit(small) is None
    ops = [Put("/a", b"xyz")]
    assert batching.commit_bytes(small, ops) == len("/a") + batching.OP_FRAMING_BYTES + 3


def test_commit_groups_on_a_contract_only_store_is_one_plain_commit(small: SmallStore) -> None:
    """Every group goes into one commit; a failed check of a group refuses it all."""
    result = batching.commit_groups(
        small, [Put("/f", b"1")], [[Put("/g0", b"")], [Put("/g1", b"")]]
    )
    assert result.succeeded and result.applied == {0: result.revision, 1: result.revision}
    assert len(small.commits) == 1 and len(small.commits[0]) == 3
    refused = batching.commit_groups(small, [], [[Put("/h", b"")], [Check("/nope", exists=True)]])
    assert not refused.succeeded and refused.failed_path == "/nope"
    assert small.get("/h") is None


def test_packing_a_contract_only_store_uses_the_default_operation_limit(
    small: SmallStore,
) -> None:
    """pack_groups cuts at DEFAULT_MAX_OPS operations for a store that names no limit."""
    groups = [[Put(f"/p{i}", b""), Put(f"/q{i}", b"")] for i in range(100)]
    chunks = pack_groups(small, groups)
    assert [len(ops) for _, ops in chunks] == [128, 72]


def test_the_project_stores_are_batching_stores() -> None:
    """MemoryStore says its limits (and ZooKeeperStore and EtcdStore: their backend
    tests check the figures); a test may lower them on one store."""
    store = open_store("memory://batching2/ns")
    assert isinstance(store, MemoryStore)
    assert isinstance(store, batching.BatchingStore)
    assert batching.max_ops_per_commit(store) == 128
    store.max_ops_per_commit = 8
    assert batching.max_ops_per_commit(store) == 8


def test_the_real_stores_implement_batching_without_a_server() -> None:
    """The classes carry every member of the protocol (constructing needs no I/O)."""
    from shardkeeper.registry.zookeeper import ZooKeeperStore

    zk = open_store("zk://127.0.0.1:1/ns")
    assert isinstance(zk, ZooKeeperStore) and isinstance(zk, batching.BatchingStore)
    assert (zk.max_ops_per_commit, zk.max_commit_bytes, zk.max_groups_per_commit) == (
        4096,
        800_000,
        None,
    )
    pytest.importorskip("etcd3")
    etcd = open_store("etcd://127.0.0.1:1/ns")
    assert isinstance(etcd, batching.BatchingStore)
    assert etcd.max_ops_per_commit == 128 and etcd.max_groups_per_commit is not None
