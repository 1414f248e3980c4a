"""Fires owed by items a count cut removes are recorded as skips (reason removed).

An item whose owner could not run some of its fires (partitioned, frozen, its lane
held) owes them; with misfire on its next run folds them. An operator's cut of
``sharding_total_count`` that removes the item leaves it no next run: before, those
fires were neither run nor recorded (600 s ZooKeeper chaos run, 47 lost pairs of
items 8-11 after a cut 12 -> 8). The leader that commits the cut records each owed
(fire, item) once as a skip ``removed`` (coordination/cuts.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.model import Assignment, RunningMark
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.coordination.results import ItemResult
from shardkeeper.coordination.sharding import necessary_value
from shardkeeper.counters import SkipReason
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.observe import ExecutionRecord, SkipRecord
from shardkeeper.ops import Operations
from shardkeeper.registry import CoordinationStore
from shardkeeper.registry.memory import MemoryServer, MemoryStore
from shardkeeper.runtime import Runtime
from shardkeeper.runtime.job.coverage import FireSchedule
from shardkeeper.runtime.job.jobstate import JobState
from shardkeeper.runtime.job.leader import LeaderDuties
from shardkeeper.runtime.job.phase import JobPhase
from shardkeeper.runtime.job.services import JobServices
from shardkeeper.scheduling.triggers import build_trigger
from shardkeeper.testing.faults import wait_until

pytestmark = pytest.mark.timeout(90)

JOB = "cut-owed"
P = JobPaths(JOB)
ME = "host@1@me"
#: sorts after every real instance id: the strategy gives it the last items
GHOST = "zzz@1@ghost"

Owed = list[tuple[float, tuple[int, ...], str]]
StoreFactory = Callable[..., CoordinationStore]


@pytest.fixture
def memory() -> Iterator[MemoryServer]:
    srv = MemoryServer()
    try:
        yield srv
    finally:
        srv.shutdown()


def _result(fire: float) -> bytes:
    return ItemResult("ok", fire, fire, fire + 0.1, "gone@1@x").to_bytes()


def _leader(store: MemoryStore, me: str, owed: Owed) -> LeaderDuties:
    """An elected leader of the job after the operator's cut 12 -> 8 (interval 1 s)."""
    services = JobServices.build(store, JOB, me)
    state = JobState(JobConfig(name=JOB, interval=1, sharding_total_count=8))
    state.phase.transition(JobPhase.REGISTERING, "the test")
    state.phase.transition(JobPhase.REGISTERED, "the test")
    store.put(services.paths.instance(me), b"{}", ephemeral=True)
    leader = LeaderDuties(
        services, state, on_removed=lambda ft, its, text: owed.append((ft, its, text))
    )
    assert leader.elect()
    return leader


def _before_cut(store: MemoryStore, last: dict[int, float]) -> None:
    """12 items, 8-11 owned by an instance that ran item ``i`` last at ``last[i]``
    (item 11 came with a raise at fire 105 and never ran); the operator's cut set
    the reshard flag at 109.5."""
    owners = {i: (ME if i < 8 else "other") for i in range(12)}
    store.put(
        P.sharding,
        Assignment(
            total=12, owners=owners, effective_fire=50.0, births=((0, 50.0), (11, 105.0))
        ).to_bytes(),
    )
    for item, fire in last.items():
        store.put(P.result(item), _result(fire))
    store.put(P.necessary, necessary_value("count 12 -> 8", at=109.5))


def _pairs(owed: Owed) -> list[tuple[float, int]]:
    return sorted((ft, i) for ft, items, _ in owed for i in items)


def test_the_fires_a_removed_item_owed_are_recorded_removed_once() -> None:
    """Item 8 last ran fire 100, item 11 never ran (born at 105), items 9 and 10 ran
    fire 109: the cut at fire 110 records 101..109 of item 8 and 105..109 of item 11
    as skips ``removed``, nothing of 9 and 10, and a later pass records nothing more.
    Before, nothing recorded them (and ``on_removed`` did not exist)."""
    srv = MemoryServer()
    store = srv.store()
    store.start()
    try:
        owed: Owed = []
        _before_cut(store, {**{i: 109.0 for i in range(8)}, 8: 100.0, 9: 109.0, 10: 109.0})
        leader = _leader(store, ME, owed)
        assert leader.serve_reshard(110.0, 0.0).name == "DONE"
        done, _ = leader._s.sharding.read()
        assert done is not None and done.total == 8
        expected = sorted(
            [(float(f), 8) for f in range(101, 110)] + [(float(f), 11) for f in range(105, 110)]
        )
        assert _pairs(owed) == expected
        assert not store.exists(P.removed)
        assert leader.settle_cuts() == 0
        leader.take_over()
        assert _pairs(owed) == expected  # once
    finally:
        srv.shutdown()


def test_a_leader_killed_after_the_cut_leaves_the_skips_to_the_next_one() -> None:
    """The cut is committed with what the removed items owe; its leader dies before
    recording them: the next leader's take-over records them, once (the older
    leader, were it still there, could not: its settle commit is refused)."""
    srv = MemoryServer()
    store_a, store_b = srv.store(), srv.store()
    store_a.start()
    store_b.start()
    try:
        first: Owed = []
        second: Owed = []
        _before_cut(store_a, {8: 107.0, 9: 109.0, 10: 109.0})
        leader_a = _leader(store_a, ME, first)
        leader_a.settle_cuts = lambda: 0  # type: ignore[method-assign]  # dies before it
        leader_a.serve_reshard(110.0, 0.0)
        assert store_a.exists(P.removed) and not first
        store_a.delete(P.leader, recursive=False)  # its session ended
        leader_b = _leader(store_b, "host@2@next", second)
        assert _pairs(second) == sorted(
            [(108.0, 8), (109.0, 8)] + [(float(f), 11) for f in range(105, 110)]
        )
        assert not store_b.exists(P.removed)
        assert LeaderDuties.settle_cuts(leader_a) == 0 and not first
        assert leader_b.settle_cuts() == 0
    finally:
        srv.shutdown()


def test_a_removed_item_still_running_is_waited_for_and_long_gaps_are_counted() -> None:
    """A removed item still running a fire before the cut: nothing is recorded until
    it ended (its result says which fire it stood for). A gap of more than 100 fires
    lists the newest 100 and counts the older ones in the record's words."""
    srv = MemoryServer()
    store = srv.store()
    store.start()
    try:
        owed: Owed = []
        _before_cut(store, {8: 105.0, 9: 109.0, 10: 105.0, 11: 109.0})
        store.put(P.result(9), _result(1.0))  # item 9 missed 2..109
        store.put(P.running(10), RunningMark("other", 107.0, f"{JOB}@107#10").to_bytes())
        store.put(P.instance("other"), b"{}", ephemeral=True)  # live: its mark stays
        leader = _leader(store, ME, owed)
        # an item still runs: the reshard applies from the next fire, so 110 is owed too
        leader.serve_reshard(110.0, 0.0)
        assert not owed and store.exists(P.removed)
        store.put(P.result(10), _result(107.0))  # it ended: 108 and 109 owed
        store.delete(P.running(10), recursive=False)
        leader.settle_cuts()
        pairs = _pairs(owed)
        assert [f for f, i in pairs if i == 8] == [float(f) for f in range(106, 111)]
        assert [f for f, i in pairs if i == 10] == [108.0, 109.0, 110.0]
        nine = [f for f, i in pairs if i == 9]
        assert nine == [float(f) for f in range(11, 111)]  # the newest 100 of 2..110
        oldest = next(text for ft, items, text in owed if ft == 11.0)
        assert "item 9: 9" in oldest
    finally:
        srv.shutdown()


class Noop(ShardedJob):
    """Every item returns at once."""

    def execute(self, ctx: ShardingContext) -> None:
        """Nothing to do."""


class Seen:
    """The skip records and the runs of the job."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.skips: list[SkipRecord] = []
        self.ran: list[tuple[int, float]] = []

    def on_execution(self, record: ExecutionRecord) -> None:
        with self.lock:
            self.ran.append((record.item, record.fire_time))

    def on_skip(self, record: SkipRecord) -> None:
        with self.lock:
            self.skips.append(record)

    def removed(self) -> list[tuple[float, int]]:
        with self.lock:
            return sorted(
                (s.fire_time, i)
                for s in self.skips
                if s.reason == SkipReason.REMOVED.value
                for i in s.items
            )


def _owner_never_runs_then_a_cut(
    runtime_store: CoordinationStore, ghost: CoordinationStore
) -> None:
    """A member that never runs its items (items 2 and 3: it holds its membership
    node and nothing else, as an owner whose lane is held or that is cut off from
    its items would) and the operator cuts the count 4 -> 2: every fire of items 2
    and 3 from their birth up to the cut's effective fire is a skip ``removed`` of
    the live instance's leader, exactly once; before, they stood nowhere."""
    ghost.put(P.instance(GHOST), b"{}", ephemeral=True)
    seen = Seen()
    rt = Runtime(runtime_store, shutdown_grace=1, observers=[seen])
    rt.add_job(Noop(), JobConfig(name=JOB, interval=0.2, sharding_total_count=4))
    rt.start()
    try:

        def ghost_owns() -> bool:
            raw = rt.store.get(P.sharding)
            doc = Assignment.from_bytes(raw.value) if raw is not None else None
            return doc is not None and doc.owners.get(2) == GHOST == doc.owners.get(3)

        wait_until(ghost_owns, 20, message="the member was never given items 2 and 3")
        wait_until(lambda: len(seen.ran) >= 6, 20, message="items 0 and 1 never ran")
        Operations(rt.store).update_config(JOB, sharding_total_count=2)

        def cut() -> Assignment | None:
            raw = rt.store.get(P.sharding)
            doc = Assignment.from_bytes(raw.value) if raw is not None else None
            return doc if doc is not None and doc.total == 2 else None

        wait_until(lambda: cut() is not None, 20, message="no reshard after the cut")
        after = cut()
        assert after is not None
        wait_until(lambda: bool(seen.removed()), 20, message="no removed skip recorded")
        wait_until(lambda: not rt.store.exists(P.removed), 20, message="never settled")
    finally:
        rt.stop()
    born = min(b for first, b in after.births) if after.births else None
    assert born is not None
    schedule = FireSchedule(
        build_trigger(JobConfig(name=JOB, interval=0.2, sharding_total_count=2))
    )
    due = [
        f
        for f in schedule.window(born - 1.5e-3, after.effective_fire + 2e-3, 10_000)[0]
        if f < after.effective_fire - 1e-6
    ]
    got = seen.removed()
    assert len(got) == len(set(got)), "a (fire, item) recorded twice"
    mine = sorted(p for p in got if p[1] in (2, 3))
    assert [f for f, i in mine if i == 2] == pytest.approx(due)
    assert [f for f, i in mine if i == 3] == pytest.approx(due)
    with seen.lock:
        assert not [r for r in seen.ran if r[0] in (2, 3)]


def test_a_runtime_records_the_fires_of_items_whose_owner_never_ran_them(
    memory: MemoryServer,
) -> None:
    """The memory store: see :func:`_owner_never_runs_then_a_cut`."""
    ghost = memory.store()
    ghost.start()
    try:
        _owner_never_runs_then_a_cut(memory.store(), ghost)
    finally:
        ghost.close()


@pytest.mark.parametrize("backend", ["zookeeper"], ids=["zk"])
def test_on_zookeeper_the_fires_a_cut_item_owed_are_recorded_removed(
    store_factory: StoreFactory,
) -> None:
    """Real ZooKeeper, the owner of items 2 and 3 a live session of its own that runs
    nothing: see :func:`_owner_never_runs_then_a_cut`."""
    _owner_never_runs_then_a_cut(store_factory(), store_factory())
