"""A dead instance's thousands of items are requeued and claimed in a few commits.

Chaos, issue 25 workload (a bulk job of 2,500 items an instance): failover went one
item at a time, a commit each (20-50 ms): 2,024 takeovers took two minutes on
ZooKeeper, and on etcd items were still queued 40 s after the faults ended. The
requeue and the claim now pack the items' conditional moves into few commits, each
item still on its own conditions. On the MemoryStore, both ways of checking groups.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import pytest

from shardkeeper.coordination.failover import FailoverService
from shardkeeper.coordination.model import FailoverEntry, RunningMark
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.errors import StoreError
from shardkeeper.registry.base import Create, Delete
from shardkeeper.registry.memory import MemoryServer, MemoryStore

P = JobPaths("bulk")
DEAD = "host@1@dead"
N = 600


@pytest.fixture(params=[False, True], ids=["together", "apart"])
def store(request: pytest.FixtureRequest) -> Iterator[MemoryStore]:
    server = MemoryServer(groups_apart=request.param)
    s = server.store()
    s.start()
    try:
        yield s
    finally:
        server.shutdown()


def _orphans(store: MemoryStore) -> None:
    ft = time.time() - 5
    for item in range(N):
        mark = RunningMark(DEAD, ft, f"bulk@1#{item}")
        store.commit(
            [
                Create(P.running(item), mark.to_bytes()),
                Create(f"{P.running(item)}/fence-{item:016x}"),
            ]
        )


def test_orphans_are_requeued_and_claimed_in_few_commits(store: MemoryStore) -> None:
    _orphans(store)
    leader = FailoverService(store, P, "host@2@leader")
    before = store.round_trips
    assert leader.requeue_orphans(live=set()) == list(range(N))
    requeue_trips = store.round_trips - before
    assert requeue_trips < N // 10, f"{requeue_trips} round trips to requeue {N} marks"
    taker = FailoverService(store, P, "host@3@taker")
    before = store.round_trips
    claims = taker.claim_many(limit=N)
    claim_trips = store.round_trips - before
    assert sorted(c.item for c in claims) == list(range(N))
    assert claim_trips < N // 10, f"{claim_trips} round trips to claim {N} items"
    assert store.children(P.failover_queue) == []
    for c in claims[:5]:
        mark = store.get(P.running(c.item))
        assert mark is not None and mark.created_revision == c.token
        assert store.exists(f"{P.running(c.item)}/{c.fence}")


def test_an_item_claimed_first_elsewhere_does_not_hold_back_the_others(
    store: MemoryStore,
) -> None:
    """Item 7 was claimed by another instance between our read and our commit (its
    entry gone, its mark there): on a store where one refused check refuses the whole
    commit, the refused commit's items are sent again in halves (a few dozen commits,
    not one per item)."""
    _orphans(store)
    FailoverService(store, P, "host@2@leader").requeue_orphans(live=set())
    taker = FailoverService(store, P, "host@3@taker")
    other = FailoverService(store, P, "host@4@other")
    # the taker has read the queue; its commit waits until the other has claimed 7
    held = store.server.pause("commit", path=P.failover_queue, thread="taker")
    got: list[list[int]] = []
    thread = threading.Thread(
        target=lambda: got.append([c.item for c in taker.claim_many(limit=N)]), name="taker"
    )
    before = store.round_trips
    thread.start()
    try:
        assert held.wait_reached(10)
        claims_other = other.claim_many([i for i in range(N) if i != 7], limit=1)
        assert [c.item for c in claims_other] == [7]
    finally:
        held.release()
        thread.join(20)
    assert got and sorted(got[0]) == [i for i in range(N) if i != 7]
    trips = store.round_trips - before
    assert trips < N // 10, f"{trips} round trips to claim {N - 1} items around one refused"


def test_claim_many_claims_at_most_its_limit_lowest_first(store: MemoryStore) -> None:
    _orphans(store)
    FailoverService(store, P, "host@2@leader").requeue_orphans(live=set())
    claims = FailoverService(store, P, "host@3@taker").claim_many([0, 1], limit=3)
    assert [c.item for c in claims] == [2, 3, 4]


def test_a_claim_of_many_items_is_one_log_line_per_fire_and_owner(
    store: MemoryStore, caplog: pytest.LogCaptureFixture
) -> None:
    """600 items of one dead owner's fire taken over: one INFO line naming the count
    and a few items, not 600 lines on the coordinating thread."""
    _orphans(store)
    FailoverService(store, P, "host@2@leader").requeue_orphans(live=set())
    caplog.set_level(logging.INFO, logger="shardkeeper.coordination.failover")
    claims = FailoverService(store, P, "host@3@taker").claim_many(limit=N)
    assert len(claims) == N
    lines = [r.getMessage() for r in caplog.records if "took over" in r.getMessage()]
    assert len(lines) == 1, lines
    assert f"took over {N} items [0, 1, 2, 3, 4, ..., " in lines[0]
    assert f"from {DEAD}" in lines[0]


def test_a_claim_round_is_sized_by_the_queue_as_listed(store: MemoryStore) -> None:
    """The round's size comes from the queue it lists (600 items here), not from a
    count known before: the runner's hint of the queue trickles in by watch events
    under load, and rounds sized by it took a dead instance's thousands of items a
    few at a time (600 s chaos on etcd: a bulk fire's failover ran for minutes)."""
    _orphans(store)
    FailoverService(store, P, "host@2@leader").requeue_orphans(live=set())
    seen: list[int] = []

    def half(queued: int) -> int:
        seen.append(queued)
        return queued // 2

    taker = FailoverService(store, P, "host@3@taker")
    claims = taker.claim_many([0, 1], limit=half)
    assert seen == [N - 2]
    assert len(claims) == (N - 2) // 2 and min(c.item for c in claims) == 2
    assert taker.claim_many(limit=lambda _q: 0) == []


def test_a_fenced_batchs_unstarted_items_are_handed_off_in_few_commits(
    store: MemoryStore,
) -> None:
    """A fenced batch hands its never-started items to failover. One commit per item
    held a 2,500-item job's lane for 20-80 s on etcd (600 s run, seed 20261211): its
    fires and its repair passes waited. Now few commits, each item still on its own
    condition: item 7's mark, replaced meanwhile, is left alone and does not hold back
    the others."""
    ft = time.time() - 5
    me = FailoverService(store, P, "host@1@me")
    marks: dict[int, tuple[int, FailoverEntry, str]] = {}
    for item in range(N):
        fence = f"fence-{item:016x}"
        mark = RunningMark("host@1@me", ft, f"bulk@1#{item}")
        done = store.commit(
            [Create(P.running(item), mark.to_bytes()), Create(f"{P.running(item)}/{fence}")]
        )
        assert done
        marks[item] = (done.revision, FailoverEntry(ft, mark.execution_id, "host@1@me"), fence)
    # item 7 was taken over meanwhile: another execution's fence child on its mark
    store.commit(
        [
            Delete(f"{P.running(7)}/fence-{7:016x}"),
            Delete(P.running(7)),
            Create(P.running(7), RunningMark("host@2@other", ft, "bulk@1#7").to_bytes()),
            Create(f"{P.running(7)}/fence-other"),
        ]
    )
    before = store.round_trips
    moved = me.hand_off(marks, keep=True)
    trips = store.round_trips - before
    assert moved == [i for i in range(N) if i != 7]
    assert trips < N // 10, f"{trips} round trips to hand off {N} items"
    queued = {int(name) for name in store.children(P.failover_queue)}
    assert queued == set(moved)
    assert store.exists(f"{P.running(7)}/fence-other")  # theirs, untouched
    assert not store.exists(P.running(8))


def test_a_hand_off_of_marks_the_leader_requeued_meanwhile_costs_no_commit_per_item(
    store: MemoryStore,
) -> None:
    """After a session loss, the leader requeued this instance's 2,500 bulk marks as
    orphans before its hand-off came: every group's condition failed, and the refused
    chunks were halved down to single items, some 5,000 commits per housekeeping pass
    (16 s of the job's lane each time: 600 s ZooKeeper chaos, seed 20261263). One
    listing of the marks leaves them out now; the one still there is handed off."""
    ft = time.time() - 5
    me = FailoverService(store, P, "host@1@me")
    marks: dict[int, tuple[int, FailoverEntry, str]] = {}
    for item in range(N):
        fence = f"fence-{item:016x}"
        mark = RunningMark("host@1@me", ft, f"bulk@1#{item}")
        done = store.commit(
            [Create(P.running(item), mark.to_bytes()), Create(f"{P.running(item)}/{fence}")]
        )
        assert done
        marks[item] = (done.revision, FailoverEntry(ft, mark.execution_id, "host@1@me"), fence)
    # the leader requeued every mark but item 3's as an orphan
    for item in range(N):
        if item != 3:
            store.commit([Delete(f"{P.running(item)}/fence-{item:016x}"), Delete(P.running(item))])
    before = store.round_trips
    moved = me.hand_off(marks, keep=True)
    trips = store.round_trips - before
    assert moved == [3]
    assert trips < 10, f"{trips} round trips to find {N - 1} marks gone"
    assert not store.exists(P.running(3))


def test_a_hand_off_whose_outcome_is_unknown_raises_for_the_caller_to_keep_it(
    store: MemoryStore,
) -> None:
    """The caller (Batches) keeps the items to hand off again only if the hand-off
    raises: a store error must not be swallowed with the items unmoved."""
    ft = time.time() - 5
    me = FailoverService(store, P, "host@1@me")
    done = store.commit([Create(P.running(0), RunningMark("host@1@me", ft, "bulk@1#0").to_bytes())])
    assert done
    entry = FailoverEntry(ft, "bulk@1#0", "host@1@me")
    store.fail_next("commit", path=P.running(0))
    with pytest.raises(StoreError):
        me.hand_off({0: (done.revision, entry, "")}, keep=True)
    assert me.hand_off({0: (done.revision, entry, "")}, keep=True) == [0]
