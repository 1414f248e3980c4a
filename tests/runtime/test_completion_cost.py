"""A refused completion of many items costs a read and a commit, not a commit per item.

A batch's completion deletes its items' marks in a few packed commits. When one is
refused (some mark is no longer ours: taken over, or already cleared by an earlier
attempt of this completion whose reply was lost), the items used to be cleared one
by one: 2,500 commits on a loaded instance held the job's lane for a minute while its
next fires were folded behind it (the production-like chaos run, issue 25). Now one
tree read tells which marks are still ours; those are cleared in one packed commit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from shardkeeper.coordination.execution import ExecutionService
from shardkeeper.coordination.model import Assignment, RunningMark
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.registry.memory import MemoryServer, MemoryStore
from shardkeeper.runtime.execute.batch import _Unfinished
from shardkeeper.runtime.fire.batches import Batches

pytestmark = pytest.mark.timeout(60)

JOB = "done"
P = JobPaths(JOB)
ME = "host@1@me"
COUNT = 1_000


@pytest.fixture(params=[False, True], ids=["together", "apart"])
def store(request: pytest.FixtureRequest) -> Iterator[MemoryStore]:
    """One plain commit per group (ZooKeeper's way) or items checked apart (etcd's)."""
    srv = MemoryServer(groups_apart=request.param)
    st = srv.store()
    st.start()
    try:
        yield st
    finally:
        st.close()
        srv.shutdown()


def _started(store: MemoryStore) -> tuple[ExecutionService, dict[int, int], dict[int, str]]:
    svc = ExecutionService(store, P, ME)
    ft = time.time()
    owners = dict.fromkeys(range(COUNT), ME)
    node = store.put(P.sharding, Assignment(total=COUNT, owners=owners).to_bytes())
    started = svc.start(
        list(range(COUNT)),
        fire_time=ft,
        execution_ids={i: f"{JOB}@{ft}#{i}" for i in range(COUNT)},
        assignment_version=node.version,
        persistent=True,
        monitor=True,
    )
    assert len(started.marked) == COUNT
    return svc, dict(started.tokens), dict(started.fences)


def _finish(svc: ExecutionService, tokens: dict[int, int], fences: dict[int, str]) -> list[int]:
    """Complete every item, one finish per start commit (token), as a batch does."""
    groups: dict[int, list[int]] = {}
    for item, token in tokens.items():
        groups.setdefault(token, []).append(item)
    return sorted(i for t, items in groups.items() for i in svc.finish(items, t, fences))


def test_one_taken_over_item_does_not_make_the_rest_clear_one_by_one(store: MemoryStore) -> None:
    svc, tokens, fences = _started(store)
    # item 7 taken over: its mark replaced by another execution's (another fence)
    store.delete(P.running(7), recursive=True)
    store.put(P.running(7), RunningMark("host@2@taker", time.time(), "x").to_bytes())
    store.put(f"{P.running(7)}/fence-other", b"")
    before = store.round_trips
    fenced = _finish(svc, tokens, fences)
    assert fenced == [7]
    assert sorted(int(n) for n in store.children(P.running_root)) == [7], "ours left or theirs gone"
    # a few per start commit (the MemoryStore packs 128 operations a commit), not one
    # per item
    assert store.round_trips - before < 5 * len(set(tokens.values())) + 10, (
        f"{store.round_trips - before} round trips"
    )


def test_a_completion_applied_with_its_reply_lost_is_found_by_one_read(store: MemoryStore) -> None:
    svc, tokens, fences = _started(store)
    assert _finish(svc, tokens, fences) == []
    before = store.round_trips
    # the retry of the same completion (its first reply was lost): nothing is ours
    assert _finish(svc, tokens, fences) == list(range(COUNT))
    # a few per start commit (the MemoryStore packs 128 operations a commit), not one
    # per item
    assert store.round_trips - before < 5 * len(set(tokens.values())) + 10, (
        f"{store.round_trips - before} round trips"
    )


def _claimed_one_by_one(store: MemoryStore, count: int) -> tuple[ExecutionService, dict[int, int]]:
    """Marks made one commit per item, as failover claims make them: a token each."""
    svc = ExecutionService(store, P, ME)
    ft = time.time()
    owners = dict.fromkeys(range(count), ME)
    node = store.put(P.sharding, Assignment(total=count, owners=owners).to_bytes())
    tokens: dict[int, int] = {}
    for i in range(count):
        started = svc.start(
            [i],
            fire_time=ft,
            execution_ids={i: f"{JOB}@{ft}#{i}"},
            assignment_version=node.version,
            persistent=False,
            monitor=True,
        )
        tokens.update(started.tokens)
    assert len(set(tokens.values())) == count, "each item's mark has its own token"
    return svc, tokens


def test_items_with_a_token_each_complete_in_one_call_of_packed_commits(
    store: MemoryStore,
) -> None:
    """A failover batch's items (each claimed with its own token) complete together:
    settled token by token, 2,500 items took 2,500 commits, and refused, as many tree
    reads: housekeeping held the job's lane 20-39 s and a bulk job starved (600 s
    ZooKeeper chaos, seed 20261243)."""
    count = 600
    svc, tokens = _claimed_one_by_one(store, count)
    store.delete(P.running(7), recursive=True)  # item 7 taken over meanwhile
    store.put(P.running(7), RunningMark("host@2@taker", time.time(), "x").to_bytes())
    before = store.round_trips
    fenced = svc.finish(sorted(tokens), tokens)
    assert fenced == [7]
    assert sorted(int(n) for n in store.children(P.running_root)) == [7], "ours left or theirs gone"
    # packed 128 operations a commit, plus one read and one commit for the refusal
    assert store.round_trips - before < count // 128 + 10, f"{store.round_trips - before}"


def test_a_wrong_token_of_one_item_leaves_that_mark_alone(store: MemoryStore) -> None:
    """Per-item tokens are per item: the mark of an item whose token is not its own
    (another execution's mark at its path) is not deleted."""
    svc, tokens = _claimed_one_by_one(store, 5)
    wrong = {**tokens, 3: tokens[3] + 10_000}
    assert svc.finish(sorted(wrong), wrong) == [3]
    assert [int(n) for n in store.children(P.running_root)] == [3]


def test_settling_a_failover_batch_is_one_completion_not_one_per_item(store: MemoryStore) -> None:
    """Batches._settle (a batch's completion and housekeeping's retry of a failed
    one) clears a failover batch's items in a few commits. Fails before: it called
    the completion once per token, one commit per claimed item."""
    count = 600
    svc, tokens = _claimed_one_by_one(store, count)
    batches = object.__new__(Batches)  # only what _settle uses: no runner needed
    batches._lock = threading.RLock()
    batches._written = set()
    batches._s = SimpleNamespace(execution=svc)  # type: ignore[assignment]
    batches._state = SimpleNamespace(count=lambda *_: None)  # type: ignore[assignment]
    batches._on_undone = None
    entry = _Unfinished(time.time(), dict(tokens), {}, {}, {})
    before = store.round_trips
    batches._settle(entry)
    assert not entry.ran
    assert store.children(P.running_root) == []
    assert store.round_trips - before < count // 128 + 10, f"{store.round_trips - before}"


def test_settling_a_fire_of_1000_items_is_one_completion_call(store: MemoryStore) -> None:
    """A plain fire's 1,000 items here complete in ONE completion call (one commit on
    ZooKeeper and on etcd), as before failover batches were settled in chunks: at 256
    items a chunk it cost 4 calls, 5 requests a trigger instead of 2
    (bench/coordination_cost.py)."""
    svc, tokens, fences = _started(store)
    batches = object.__new__(Batches)  # only what _settle uses: no runner needed
    batches._lock = threading.RLock()
    batches._written = set()
    batches._s = SimpleNamespace(execution=svc)  # type: ignore[assignment]
    batches._state = SimpleNamespace(count=lambda *_: None)  # type: ignore[assignment]
    batches._on_undone = None
    calls: list[int] = []
    finish = svc.finish

    def counted(items: list[int], *args: object, **kwargs: object) -> list[int]:
        calls.append(len(items))
        return finish(items, *args, **kwargs)  # type: ignore[arg-type]

    svc.finish = counted  # type: ignore[method-assign,assignment]
    entry = _Unfinished(time.time(), dict(tokens), {}, {}, dict(fences))
    batches._settle(entry)
    assert not entry.ran
    assert store.children(P.running_root) == []
    # one completion call: the store packs it into as few commits as its limits allow
    assert calls == [COUNT]
