"""An operator's disable has a time, and the trigger decides by fire time: a fire due
before the disable is decided as usual (run now, or folded into the item's next run)
even when its owner decides it only after the disable (a reshard wait, a busy item);
a fire due at or after the disable is a ``disabled`` skip, one record per (fire,
item) whichever step of the fire found it (600 s ZooKeeper chaos run: such fires of
jobs ``cpu`` and ``chaos`` were skipped as ``disabled`` and lost, and a fire whose
items were busy elsewhere recorded no skip for its disabled item)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.config_service import ConfigService
from shardkeeper.coordination.model import Assignment, RunningMark
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.counters import SkipReason
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.observe import ExecutionRecord, SkipRecord
from shardkeeper.ops import Operations
from shardkeeper.registry.base import CoordinationStore, EventKind, WatchEvent
from shardkeeper.registry.clock import ServerTime
from shardkeeper.registry.memory import MemoryServer, MemoryStore
from shardkeeper.runtime import Runtime
from shardkeeper.runtime.fire.batches import Batch
from shardkeeper.runtime.fire.trigger import Deferred, Fire, Launched, Skipped, TriggerFlow, Wait
from shardkeeper.runtime.job import events as ev
from shardkeeper.runtime.job.jobstate import JobState, switch_time
from shardkeeper.runtime.job.leader import LeaderDuties
from shardkeeper.runtime.job.phase import JobPhase
from shardkeeper.runtime.job.services import JobServices
from shardkeeper.runtime.runner.settings import JobSettings
from shardkeeper.testing.faults import wait_until

pytestmark = pytest.mark.timeout(60)

JOB = "distime"
ME = "host@1@me"
COUNT = 3


@pytest.fixture
def store() -> Iterator[MemoryStore]:
    server = MemoryServer()
    s = server.store()
    s.start()
    try:
        yield s
    finally:
        server.shutdown()


def _flow(
    store: MemoryStore, held: set[int] | None = None
) -> tuple[TriggerFlow, JobState, JobSettings, list[Batch]]:
    """A registered job of COUNT items, all assigned here, stored as an instance
    registers it (so that the operations API finds it)."""
    config = JobConfig(name=JOB, interval=1, sharding_total_count=COUNT, misfire=True)
    services = JobServices.build(store, JOB, ME)
    store.put(services.paths.config, ConfigService.initial_document(config))
    state = JobState(config)
    node = store.put(services.paths.instance(ME), b"{}", ephemeral=True)
    state.member_revision = node.created_revision
    state.phase.transition(JobPhase.REGISTERING, "the test")
    state.phase.transition(JobPhase.REGISTERED, "the test")
    owners = dict.fromkeys(range(COUNT), ME)
    store.put(services.paths.sharding, Assignment(total=COUNT, owners=owners).to_bytes())
    launched: list[Batch] = []
    leader = LeaderDuties(services, state)
    flow = TriggerFlow(
        services,
        state,
        leader,
        local_items=lambda: set(held or ()),
        launch=launched.append,
        session=lambda: store.session_id,
        owns=lambda item, ex: any(b.execution_ids.get(item) == ex for b in launched),
    )
    settings = JobSettings(services, state, leader, port=None)  # type: ignore[arg-type]
    return flow, state, settings, launched


def _disabled_at(store: CoordinationStore, path: str) -> float:
    node = store.get(path)
    assert node is not None
    return float(json.loads(node.value)["at"])


# ---- the job's switch ------------------------------------------------------------------


def test_a_fire_due_before_a_job_disable_runs_when_decided_after_it(store: MemoryStore) -> None:
    """``shardkeeper disable JOB`` stores its time; a fire due before it (decided only
    now) runs every item, a fire due after it is the job's ``disabled`` skip."""
    flow, state, settings, launched = _flow(store)
    before = time.time() - 0.5
    Operations(store).disable_job(JOB)
    at = _disabled_at(store, JobPaths(JOB).disabled_job)
    assert before < at <= time.time()
    settings.reload_switches()
    assert flow.step(Fire(before)) == Launched((0, 1, 2))
    assert flow.step(Fire(at + 0.5)) == Skipped(SkipReason.DISABLED)
    assert flow.step(Fire(at)) == Skipped(SkipReason.DISABLED)  # at the disable: off
    assert [b.fire_time for b in launched] == [before]
    assert state.disabled_job and state.disabled_job_at == at


def test_a_job_switch_seen_by_its_watch_event_carries_the_time(store: MemoryStore) -> None:
    """The watch event of the switch's node brings its time to the runner (as a
    re-read does): a fire from before it is still run."""
    flow, state, settings, _launched = _flow(store)
    paths = JobPaths(JOB)
    Operations(store).disable_job(JOB)
    node = store.get(paths.disabled_job)
    assert node is not None
    event = ev.classify(WatchEvent(EventKind.CREATED, paths.disabled_job, node.value), ME)
    assert isinstance(event, ev.JobSwitched) and not event.on
    settings.switch_job(event.on, event.at)
    at = _disabled_at(store, paths.disabled_job)
    assert state.disabled_job_at == at > 0
    assert flow.step(Fire(at - 1)) == Launched((0, 1, 2))
    assert flow.step(Fire(at + 1)) == Skipped(SkipReason.DISABLED)


def test_a_switch_without_a_time_still_disables_every_fire(store: MemoryStore) -> None:
    """A switch written by an older version (no time in it, or not JSON) keeps its
    old meaning: every fire from now on is skipped, whenever it was due."""
    flow, state, settings, _ = _flow(store)
    paths = JobPaths(JOB)
    for value in (b"", b"{}", b"not json", b'{"at": "soon"}', b'{"at": -1}'):
        assert switch_time(value) == 0.0
        store.put(paths.disabled_job, value)
        settings.reload_switches()
        assert state.disabled_job and state.disabled_job_at == 0.0
        assert flow.step(Fire(time.time() - 3600)) == Skipped(SkipReason.DISABLED)


def test_a_config_that_says_disabled_disables_every_fire(store: MemoryStore) -> None:
    """The config's own ``disabled`` flag carries no time: every fire is off."""
    flow, state, _settings, _ = _flow(store)
    state.set_config(state.config.model_copy(update={"disabled": True}))
    assert flow.step(Fire(time.time() - 3600)) == Skipped(SkipReason.DISABLED)


# ---- the items' switches ---------------------------------------------------------------


def test_a_fire_due_before_an_item_disable_runs_that_item(store: MemoryStore) -> None:
    """Item 1 disabled after the fire was due, the fire decided after: item 1 runs
    with the others, and no ``disabled`` skip names it; the next fire leaves it out
    and records the skip."""
    flow, _state, settings, launched = _flow(store)
    before = time.time() - 0.5
    Operations(store).disable_item(JOB, 1)
    at = _disabled_at(store, JobPaths(JOB).disabled_item(1))
    settings.reload_switches()
    assert flow.step(Fire(before)) == Launched((0, 1, 2))
    assert flow.disabled == ()
    for i in range(COUNT):  # as the run's completion does
        store.delete(JobPaths(JOB).running(i), recursive=True)
    assert flow.step(Fire(at)) == Launched((0, 2))
    assert list(flow.disabled) == [1]
    assert [b.items for b in launched] == [[0, 1, 2], [0, 2]]


def test_a_fire_due_before_an_item_disable_is_folded_into_its_next_run(
    store: MemoryStore,
) -> None:
    """Item 1 still runs here (an earlier fire): a fire due before the item's disable
    is folded into the item's next run (Deferred, the misfire re-run stands for it),
    not recorded as a ``disabled`` skip that no run will ever make good. Its free
    siblings start at once (each item ends on its own: issue 36 §2)."""
    flow, _state, settings, launched = _flow(store, held={1})
    before = time.time() - 0.5
    Operations(store).disable_item(JOB, 1)
    settings.reload_switches()
    assert flow.step(Fire(before)) == Deferred((1,))
    assert flow.disabled == ()
    assert [b.items for b in launched] == [[0, 2]]


def test_a_misfire_rerun_folds_no_fire_from_the_disable_on(store: MemoryStore) -> None:
    """A re-run of a fire from before item 1's disable runs item 1 and covers the
    fires it folds up to the disable; the fires folded after it are the item's
    ``disabled`` skips and are not listed in its covers (the other items' are)."""
    flow, _state, settings, launched = _flow(store)
    before = time.time() - 3.0
    Operations(store).disable_item(JOB, 1)
    at = _disabled_at(store, JobPaths(JOB).disabled_item(1))
    settings.reload_switches()
    last = at + 2.0
    assert flow.step(Fire(before, misfire=True, folds_until=last)) == Launched((0, 1, 2))
    [batch] = launched
    assert batch.covers[1] and all(ft < at for ft in batch.covers[1])
    assert max(batch.covers[0]) == last


def test_every_step_of_a_fire_keeps_its_disabled_items(store: MemoryStore) -> None:
    """Item 2 busy elsewhere with a later fire, item 1 disabled before the fire: the
    first step starts item 0 and waits for item 2 (narrowing the fire to it); the
    step that decides the fire still names item 1 as ``disabled`` (the chaos run's
    fire T+376.6 of item 3 had no skip record at all)."""
    flow, _state, settings, launched = _flow(store)
    Operations(store).disable_item(JOB, 1)
    settings.reload_switches()
    ft = time.time()  # after the disable, and due already
    paths = JobPaths(JOB)
    store.put(paths.running(2), RunningMark("host@2@other", ft + 1, f"{JOB}@later#2").to_bytes())
    fire = Fire(ft)
    assert isinstance(flow.step(fire), Wait)
    assert fire.only == frozenset({2})
    store.delete(paths.running(2))
    assert flow.step(fire) == Launched((2,))
    assert flow.disabled == (1,)
    assert [b.items for b in launched] == [[0], [2]]


# ---- the time: the store's where it gives one ------------------------------------------


class _ClockStore:
    """The memory store with a server clock, as the ZooKeeper store has one (the
    ``mtime`` of a write), set far from this host's clock."""

    def __init__(self, store: MemoryStore, seconds: float) -> None:
        self._store = store
        self.seconds = seconds
        self.asked: list[str] = []

    def server_time(self, path: str, value: bytes) -> ServerTime | None:
        self.asked.append(path)
        if self._store.get(path) is None:
            return None
        self._store.put(path, value)
        return ServerTime(self.seconds, 0.001, "zookeeper mtime")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def test_the_disable_time_is_the_stores_where_it_gives_one(store: MemoryStore) -> None:
    """On a store with a clock (ZooKeeper) the switch holds the store's time, not the
    writer's: the CLI host's clock is held to nothing."""
    _flow(store)
    clocked = _ClockStore(store, 1_000_000.5)
    ops = Operations(clocked)  # type: ignore[arg-type]
    ops.disable_item(JOB, 2)
    ops.disable_job(JOB)
    paths = JobPaths(JOB)
    for path in (paths.disabled_item(2), paths.disabled_job):
        node = store.get(path)
        assert node is not None
        doc = json.loads(node.value)
        assert doc["at"] == 1_000_000.5 and doc["clock"] == "zookeeper mtime"
    assert clocked.asked == [paths.disabled_item(2), paths.disabled_job]


def test_the_disable_time_is_the_writers_clock_on_a_store_without_one(
    store: MemoryStore,
) -> None:
    """etcd (and the memory store) tell no time: the writer's clock is stored."""
    _flow(store)
    before = time.time()
    Operations(store).disable_item(JOB, 0)
    node = store.get(JobPaths(JOB).disabled_item(0))
    assert node is not None
    doc = json.loads(node.value)
    assert doc["clock"] == "writer" and before <= doc["at"] <= time.time()


# ---- a whole runtime -------------------------------------------------------------------


class Blocking(ShardedJob):
    """Item 0's first run waits for ``release``; every other run returns at once."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.first = threading.Event()

    def execute(self, ctx: ShardingContext) -> None:
        if not self.first.is_set():
            self.first.set()
            self.release.wait(30)


class Seen:
    """Keeps the executions and skips."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runs: list[ExecutionRecord] = []
        self.skips: list[SkipRecord] = []

    def on_execution(self, record: ExecutionRecord) -> None:
        with self.lock:
            self.runs.append(record)

    def on_skip(self, record: SkipRecord) -> None:
        with self.lock:
            self.skips.append(record)


def test_fires_folded_before_a_job_disable_are_run_while_it_is_disabled() -> None:
    """Item 0 runs long; the fires that come meanwhile are folded into its re-run.
    The job is disabled before the item ends: the re-run of those fires (all due
    before the disable) still starts, while the job is disabled, and covers no fire
    from the disable on; those are ``disabled`` skips (before: no re-run until an
    enable, the folded fires lost for the whole disabled stretch)."""
    server = MemoryServer()
    job, seen = Blocking(), Seen()
    rt = Runtime(server.store(), shutdown_grace=1, observers=[seen])
    rt.add_job(job, JobConfig(name=JOB, interval=0.2, sharding_total_count=1, misfire=True))
    rt.start()
    ops = Operations(rt.store)
    try:
        assert job.first.wait(10)
        state = rt.runners[JOB].state
        wait_until(lambda: state.misfire_at is not None, 10, message="no fire was folded")
        folded_from = state.misfire_at
        assert folded_from is not None
        ops.disable_job(JOB)
        at = _disabled_at(rt.store, JobPaths(JOB).disabled_job)
        wait_until(lambda: state.disabled_job, 10, message="switch not seen")
        job.release.set()

        def rerun() -> ExecutionRecord | None:
            with seen.lock:
                return next((r for r in seen.runs if r.misfire), None)

        wait_until(lambda: rerun() is not None, 10, message="no re-run while disabled")
        wait_until(
            lambda: any(s.fire_time >= at for s in seen.skips), 10, message="no disabled skip"
        )
        assert state.disabled_job  # still disabled: the re-run ran meanwhile
    finally:
        ops.enable_job(JOB)
        rt.stop()
        server.shutdown()
    run = rerun()
    assert run is not None and run.fire_time == folded_from < at
    assert all(ft < at for ft in run.covers)
    with seen.lock:
        skips = list(seen.skips)
    assert all(s.reason == SkipReason.DISABLED.value for s in skips if s.fire_time >= at)
    assert not any(s.reason == SkipReason.DISABLED.value and s.fire_time < at for s in skips)


def test_a_second_delivery_of_a_fire_records_no_disabled_skip_again() -> None:
    """A fire delivered twice is decided once: its disabled item's skip is recorded
    once, not again with the duplicate (whose own record is the ``duplicate`` skip)."""
    from datetime import UTC, datetime

    server = MemoryServer()
    seen = Seen()
    rt = Runtime(server.store(), shutdown_grace=1, observers=[seen])
    quick = Blocking()
    quick.first.set()  # no run waits
    rt.add_job(quick, JobConfig(name=JOB, cron="0 0 1 1 *", sharding_total_count=2))
    rt.start()
    try:
        runner = rt.runners[JOB]
        wait_until(lambda: runner.state.registered and runner.leader.is_leader, 10)
        Operations(rt.store).disable_item(JOB, 1)
        wait_until(lambda: 1 in runner.state.disabled_items, 10, message="switch not seen")
        at = datetime.fromtimestamp(time.time() + 0.05, UTC)  # after the disable
        runner.on_trigger(at)
        wait_until(lambda: len(seen.runs) == 1 and not runner.pending_fires(), 10)
        runner.on_trigger(at)
        wait_until(lambda: not runner.pending_fires() and runner.stats["skipped"] >= 2, 10)
    finally:
        rt.stop_now()
        server.shutdown()
    with seen.lock:
        reasons = sorted(s.reason for s in seen.skips if s.fire_time == at.timestamp())
    assert reasons == sorted([SkipReason.DISABLED.value, SkipReason.DUPLICATE.value])


def test_the_fires_a_disabled_rerun_would_fold_are_disabled_skips_too() -> None:
    """Item 0 runs long; the fires meanwhile are folded into its re-run. Its switch,
    seen late, says it was disabled before the first of them: the re-run is a
    ``disabled`` skip of item 0, and so is every fire it would have folded (before,
    only the re-run's own fire had a record: the folded ones stood nowhere)."""
    server = MemoryServer()
    job, seen = Blocking(), Seen()
    rt = Runtime(server.store(), shutdown_grace=1, observers=[seen])
    rt.add_job(job, JobConfig(name=JOB, interval=0.2, sharding_total_count=1, misfire=True))
    rt.start()
    try:
        assert job.first.wait(10)
        state = rt.runners[JOB].state
        wait_until(lambda: state.misfire_last is not None, 10, message="no fire was folded")
        wait_until(
            lambda: (state.misfire_last or 0) - (state.misfire_at or 0) >= 0.35,
            10,
            message="fewer than three fires folded",
        )
        first = state.misfire_at
        assert first is not None
        # the operator's switch as an instance sees it late: set before those fires
        switch = json.dumps({"by": "test", "at": first - 0.01, "action": "disable item"})
        rt.store.put(JobPaths(JOB).disabled_item(0), switch.encode())
        wait_until(lambda: 0 in state.disabled_items, 10, message="switch not seen")
        # no fire is folded from now on (item 0 is off for them): these were
        last = state.misfire_last
        assert last is not None
        job.release.set()

        def off() -> set[float]:
            with seen.lock:
                return {s.fire_time for s in seen.skips if s.reason == SkipReason.DISABLED.value}

        folded = {round(first + 0.2 * k, 3) for k in range(1, round((last - first) / 0.2) + 1)}
        assert len(folded) >= 2

        def missing() -> set[float]:
            return {first, *folded} - {round(ft, 3) for ft in off()}

        wait_until(
            lambda: not missing(),
            10,
            message=lambda: f"no disabled skip of the fires {sorted(missing())}",
        )
    finally:
        rt.stop()
        server.shutdown()
    with seen.lock:
        assert not any(r.misfire for r in seen.runs)  # the re-run did not run
