"""Fencing conditions on the real stores: what a zombie or a stale process can write.

The checks here are the ones the runtime's commits carry (issue 9 section 4): the
completion of a persistent mark checks its unique fence child (an existence check of
a path that is never reused, native on a ZooKeeper multi, so no pre-read can race
with a take-over); start and claim commits check the instance's own membership
node's creation revision; the requeue of a dead owner's mark checks that the owner's
membership node is absent.
"""

from __future__ import annotations

import time

from shardkeeper.coordination.execution import ExecutionService
from shardkeeper.coordination.failover import FailoverService
from shardkeeper.coordination.model import FailoverEntry, RunningMark
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.registry.base import Check, CoordinationStore, Put

JOB = "fence"
P = JobPaths(JOB)
ZOMBIE, TAKER = "host@1@zombie", "host@2@taker"


def _ready(store: CoordinationStore) -> int:
    """A job with an assignment; returns its version."""
    node = store.put(P.sharding, b'{"total": 1}')
    return node.version


def test_a_zombies_completion_cannot_delete_the_takers_mark(store: CoordinationStore) -> None:
    """The zombie marked item 0, was taken over (its mark requeued and claimed by the
    taker, a new mark at the same path), and completes late: nothing it writes may
    touch the taker's mark."""
    version = _ready(store)
    zombie = ExecutionService(store, P, ZOMBIE)
    started = zombie.start(
        [0],
        fire_time=1.0,
        execution_ids={0: "fence@1000#0"},
        assignment_version=version,
        persistent=True,
        monitor=True,
    )
    assert started.marked == (0,) and started.fences[0]
    # the leader requeues the zombie's mark (its owner is absent) and the taker claims
    leader = FailoverService(store, P, "host@3@leader")
    assert leader.requeue_orphans(live=set()) == [0]
    claim = FailoverService(store, P, TAKER).claim()
    assert claim is not None and claim.fence and claim.fence != started.fences[0]
    # the zombie's completion, with its own token and fence: refused, mark intact
    fenced = zombie.finish([0], started.tokens[0], started.fences)
    assert fenced == [0]
    mark = store.get(P.running(0))
    assert mark is not None
    assert RunningMark.from_bytes(mark.value).instance_id == TAKER
    assert store.exists(f"{P.running(0)}/{claim.fence}")
    # and the taker's own completion clears it
    assert ExecutionService(store, P, TAKER).finish([0], claim.token, {0: claim.fence}) == []
    assert not store.exists(P.running(0))


def test_a_start_commit_needs_the_membership_it_registered(store: CoordinationStore) -> None:
    """A process whose membership node is not the one it created (its session ended,
    and it or someone re-created the node) cannot write marks."""
    version = _ready(store)
    me = ExecutionService(store, P, ZOMBIE)
    member = store.put(P.instance(ZOMBIE), b"{}", ephemeral=True)
    stale = Check(P.instance(ZOMBIE), created_revision=member.created_revision)
    store.delete(P.instance(ZOMBIE))
    store.put(P.instance(ZOMBIE), b"{}", ephemeral=True)  # a later incarnation
    result = me.start(
        [0],
        fire_time=2.0,
        execution_ids={0: "fence@2000#0"},
        assignment_version=version,
        persistent=True,
        monitor=True,
        membership=stale,
    )
    assert result.marked == () and result.reason == "membership"
    assert not store.exists(P.running(0))


def test_a_claim_needs_the_membership_it_registered(store: CoordinationStore) -> None:
    """The claim commit carries the same membership condition."""
    entry = FailoverEntry(3.0, "fence@3000#0", "host@9@gone")
    store.put(P.failover_item(0), entry.to_bytes())
    member = store.put(P.instance(TAKER), b"{}", ephemeral=True)
    stale = Check(P.instance(TAKER), created_revision=member.created_revision + 10_000)
    taker = FailoverService(store, P, TAKER)
    assert taker.claim(membership=stale) is None
    assert store.exists(P.failover_item(0)) and not store.exists(P.running(0))
    ok = Check(P.instance(TAKER), created_revision=member.created_revision)
    assert taker.claim(membership=ok) is not None


def test_requeue_never_moves_the_mark_of_a_present_owner(store: CoordinationStore) -> None:
    """Decided from a stale member list, the requeue still moves nothing while the
    owner's membership node exists."""
    store.put(P.instance(ZOMBIE), b"{}", ephemeral=True)
    store.commit([Put(P.running(0), RunningMark(ZOMBIE, time.time(), "x@1#0").to_bytes())])
    leader = FailoverService(store, P, "host@3@leader")
    assert leader.requeue_orphans(live=set()) == []
    assert store.exists(P.running(0)) and not store.children(P.failover_queue)
