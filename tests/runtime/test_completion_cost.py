"""A refused completion of many items costs a read and a commit, not a commit per item.

A batch's completion deletes its items' marks in a few packed commits. When one is
refused (some mark is no longer ours: taken over, or already cleared by an earlier
attempt of this completion whose reply was lost), the items used to be cleared one
by one: 2,500 commits on a loaded instance held the job's lane for a minute while its
next fires were folded behind it (the production-like chaos run, issue 25). Now one
tree read tells which marks are still ours; those are cleared in one packed commit.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from shardkeeper.coordination.execution import ExecutionService
from shardkeeper.coordination.model import Assignment, RunningMark
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.registry.memory import MemoryServer, MemoryStore

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
