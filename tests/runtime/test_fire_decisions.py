"""A fire's decision for every item: nothing of a fire is dropped silently.

Reliability review of 3005b15 (findings 3, 4, 7, 8 and 14), replayed on the
MemoryStore with the trigger driven step by step (no runtime, no threads beyond the
store's): a fire packed into several commits, a commit whose outcome is unknown, a
store that refuses a commit as too large, a run-now stamped far ahead, and the cost of
a refused start. Each test failed on 3005b15.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.model import Assignment, RunningMark
from shardkeeper.registry.memory import MemoryServer, MemoryStore
from shardkeeper.runtime.fire.batches import Batch
from shardkeeper.runtime.fire.trigger import (
    Deferred,
    Fire,
    Launched,
    Skipped,
    StepResult,
    TriggerFlow,
    Wait,
)
from shardkeeper.runtime.job.jobstate import JobState, SkipReason
from shardkeeper.runtime.job.leader import LeaderDuties
from shardkeeper.runtime.job.phase import JobPhase
from shardkeeper.runtime.job.services import JobServices

pytestmark = pytest.mark.timeout(60)

JOB = "decide"
ME = "host@1@me"
TAKER = "host@2@taker"


@pytest.fixture(params=[False, True], ids=["together", "apart"])
def server(request: pytest.FixtureRequest) -> Iterator[MemoryServer]:
    """A server whose commit_groups is one plain commit (ZooKeeper's way), or checks
    each item apart (etcd's nested transactions)."""
    srv = MemoryServer(groups_apart=request.param)
    try:
        yield srv
    finally:
        srv.shutdown()


class Harness:
    """One instance's TriggerFlow over a started store, owning every item."""

    def __init__(
        self, store: MemoryStore, total: int, held: set[int] | None = None, **cfg: object
    ) -> None:
        self.store = store
        self.services = JobServices.build(store, JOB, ME)
        self.state = JobState(
            JobConfig(name=JOB, interval=1, sharding_total_count=total, failover=True, **cfg)  # type: ignore[arg-type]
        )
        node = store.put(self.services.paths.instance(ME), b"{}", ephemeral=True)
        self.state.member_revision = node.created_revision
        self.state.phase.transition(JobPhase.REGISTERING, "the test")
        self.state.phase.transition(JobPhase.REGISTERED, "the test")
        self.state.marks_suspect = False  # as after a first repair pass
        self.launched: list[Batch] = []
        self.held = held or set()
        store.put(
            self.services.paths.sharding,
            Assignment(total=total, owners=dict.fromkeys(range(total), ME)).to_bytes(),
        )
        self.flow = TriggerFlow(
            self.services,
            self.state,
            LeaderDuties(self.services, self.state),
            local_items=lambda: set(self.held),
            launch=self.launched.append,
            session=lambda: store.session_id,
            owns=lambda item, ex: any(b.execution_ids.get(item) == ex for b in self.launched),
        )

    def started(self) -> list[int]:
        """Every item launched so far, in launch order (an item twice: twice)."""
        return [i for b in self.launched for i in b.items]

    def decide(self, fire: Fire, *, max_steps: int = 100) -> StepResult:
        """Step ``fire`` until it is decided (not Wait), as the runner's lane does."""
        for _ in range(max_steps):
            result = self.flow.step(fire)
            if not isinstance(result, Wait):
                return result
        raise AssertionError(f"fire still undecided after {max_steps} steps: {result}")

    def foreign_mark(self, item: int, fire_time: float) -> None:
        """``item`` marked running by another instance (a failover taker)."""
        mark = RunningMark(TAKER, fire_time, f"{JOB}@other#{item}")
        self.store.put(self.services.paths.running(item), mark.to_bytes())


def test_a_later_commit_of_a_fire_that_fails_is_decided_again(server: MemoryServer) -> None:
    """Finding 3: a fire of 100 items needs two commits on the MemoryStore (62 marks
    with their fences fit one). The second failed with nothing applied; its 38 items
    were dropped for that fire with no skip recorded (the fire was reported launched).
    They are now decided again in the same fire and run."""
    store = server.store()
    store.start()
    h = Harness(store, 100)
    store.fail_next("commit", path=h.services.paths.running(80))
    h.decide(Fire(time.time()))
    assert sorted(h.started()) == list(range(100))
    assert h.state.marks_suspect, "an unknown outcome must make the repair pass look"


def test_a_later_commit_applied_with_its_reply_lost_is_adopted_not_run_twice(
    server: MemoryServer,
) -> None:
    """Finding 3, the lost reply: the second commit was applied but its reply lost.
    Its marks are read back and adopted: every item starts once."""
    store = server.store()
    store.start()
    h = Harness(store, 100)
    store.fail_next("commit", path=h.services.paths.running(80), applied=True)
    h.decide(Fire(time.time()))
    assert sorted(h.started()) == list(range(100))


def test_a_later_commit_refused_by_one_busy_item_starts_the_others(
    server: MemoryServer,
) -> None:
    """Finding 3, as seen at 6,000 items after a session expiry: a failover taker still
    ran item 80 for the previous fire, so the second commit (ZooKeeper: all or
    nothing) was refused and items 62-99 never ran for that fire. Now the free ones
    start at once and item 80 after the taker's run, within the fire's deadline."""
    store = server.store()
    store.start()
    h = Harness(store, 100)
    ft = time.time()
    h.foreign_mark(80, ft - 1)
    fire = Fire(ft)
    assert isinstance(h.flow.step(fire), Wait), "item 80 is busy: the fire waits for it"
    assert sorted(h.started()) == [i for i in range(100) if i != 80]
    store.delete(h.services.paths.running(80))
    assert isinstance(h.decide(fire), Launched)
    assert sorted(h.started()) == list(range(100))


def test_the_rest_of_an_adopted_start_keeps_its_own_decision() -> None:
    """Finding 4: the first start (etcd: checked apart) applied item 0, was refused for
    item 1 (a taker runs it for the previous fire), and its reply was lost with the
    read-back failing too. The second start adopted item 0 and threw away the rest's
    "wait for the taker": item 1 never ran for that fire. It now runs once the taker's
    run ended."""
    srv = MemoryServer(groups_apart=True)
    try:
        store = srv.store()
        store.start()
        h = Harness(store, 2)
        ft = time.time()
        h.foreign_mark(1, ft - 1)
        paths = h.services.paths
        store.fail_next("commit", path=paths.running_root, applied=True)
        store.fail_next("get", path=paths.running(0))  # the read-back of 3005b15
        store.fail_next("get_tree", path=paths.running_root)  # the read-back now
        fire = Fire(ft)
        for _ in range(10):
            result = h.flow.step(fire)
            if h.started():
                break
        assert h.started() == [0]
        assert isinstance(result, Wait), f"the fire must wait for item 1, not end: {result}"
        store.delete(paths.running(1))
        assert isinstance(h.decide(fire), Launched)
        assert h.started() == [0, 1]
    finally:
        srv.shutdown()


def test_a_run_now_stamped_far_ahead_is_decided_by_its_deadline(server: MemoryServer) -> None:
    """Finding 7: an operator whose clock runs 30 s ahead triggers the job while an
    item runs here. The fire's wait ignored its deadline: past it, the lane looked
    again without a pause until the fire time (a busy loop, every fire folded). The
    wait is now bounded by the deadline, and then the fire is decided (a misfire)."""
    store = server.store()
    store.start()
    h = Harness(store, 2, held={0}, sharding_wait_timeout=2)
    fire = Fire(time.time() + 30, manual=True)
    first = h.flow.step(fire)
    assert isinstance(first, Wait)
    assert first.delay <= 2 + 1e-6, f"a wait past the fire's deadline: {first}"
    fire.deadline = time.monotonic() - 0.001  # the deadline has passed
    assert h.flow.step(fire) == Deferred((0,))


def test_a_commit_the_store_refuses_as_too_large_is_split() -> None:
    """Finding 14: a store whose request limit is below what the packing assumed (etcd
    with a lower --max-request-bytes) refused the start commit; that definite refusal
    was taken for an unknown outcome: read back, retried, and the fire skipped, at
    every fire. The commit is now split until the store takes it."""
    srv = MemoryServer(max_request_bytes=2_000)
    try:
        store = srv.store()
        store.start()
        h = Harness(store, 60)
        before = store.round_trips
        assert isinstance(h.decide(Fire(time.time())), Launched)
        assert sorted(h.started()) == list(range(60))
        assert not h.state.marks_suspect, "a refusal is not an unknown outcome"
        assert store.round_trips - before < 20, "split commits only, no read-back per item"
    finally:
        srv.shutdown()


def test_a_single_item_the_store_refuses_as_too_large_is_a_named_skip() -> None:
    """Finding 14: when even one item's commit is over the store's limit, the fire is
    skipped with a reason that says so (it used to be "assignment kept changing",
    after a read-back and retries until the deadline)."""
    srv = MemoryServer()
    try:
        store = srv.store()
        store.start()
        h = Harness(store, 2)
        srv.max_request_bytes = 40  # below one running mark
        result = h.flow.step(Fire(time.time()))
        assert result == Skipped(SkipReason.STORE_LIMIT, (0, 1))
        assert not h.started()
    finally:
        srv.shutdown()


def test_a_refused_start_of_many_items_costs_a_constant_number_of_reads(
    server: MemoryServer,
) -> None:
    """Finding 8: a start refused because one of 500 items runs elsewhere read every
    item's mark one by one (500-1,000 round trips, seconds on a real link, holding the
    job's lane). The marks are now read in one tree read."""
    store = server.store()
    store.start()
    h = Harness(store, 500)
    ft = time.time()
    h.foreign_mark(7, ft - 1)
    before = store.round_trips
    fire = Fire(ft)
    h.flow.step(fire)
    assert sorted(h.started()) == [i for i in range(500) if i != 7]
    assert store.round_trips - before < 30, f"{store.round_trips - before} round trips"


def test_items_a_count_cut_removed_are_decided_as_a_skip(server: MemoryServer) -> None:
    """A fire decided from the owners the assignment keeps for it (a fire that waited
    behind a freeze or a running item), after an operator cut the count 4 -> 2: items
    2 and 3 have nobody to run them any more. They were left out without a trace (600
    s ZooKeeper production-like run, seed 20261226: a cut 12 -> 8 came 0.78 s after a
    fire whose owner froze); now the decision names them (``removed``; the runner
    records them as a skip with reason REMOVED, docs/monitoring.md)."""
    store = server.store()
    store.start()
    h = Harness(store, 2)
    ft = time.time()
    kept = Assignment(
        total=2,
        owners={0: ME, 1: ME},
        effective_fire=ft + 5,
        previous=dict.fromkeys(range(4), ME),
        previous_effective=ft - 10,
    )
    store.put(h.services.paths.sharding, kept.to_bytes())
    result = h.decide(Fire(ft))
    assert isinstance(result, Launched) and sorted(result.items) == [0, 1]
    assert h.flow.removed == (2, 3)
    assert SkipReason.REMOVED.value.startswith("items an operator's cut")
