"""One-off jobs (``JobConfig.at``) in-process, on the reference MemoryStore: the done
marker, the catch-up of a missed fire, misfire off, an operator's re-run, and the
start condition that keeps two fires from both running an item."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.execution import ExecutionService
from shardkeeper.coordination.oneoff import DoneRecord, OneOffService
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.coordination.results import ItemResult
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.ops import Operations
from shardkeeper.registry.memory import MemoryServer, MemoryStore
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until

pytestmark = pytest.mark.timeout(60)

JOB = "once"
P = JobPaths(JOB)


class Recorder(ShardedJob):
    """Records (instance, item, fire time, catch-up params) of every execution."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, int, float]] = []
        self._lock = threading.Lock()

    def execute(self, ctx: ShardingContext) -> None:
        with self._lock:
            self.runs.append((ctx.instance_id, ctx.item, ctx.fire_time.timestamp()))


@pytest.fixture
def server() -> Iterator[MemoryServer]:
    srv = MemoryServer()
    try:
        yield srv
    finally:
        srv.shutdown()


@pytest.fixture
def admin(server: MemoryServer) -> Iterator[MemoryStore]:
    store = server.store()
    store.start()
    try:
        yield store
    finally:
        store.close()


def _config(at: float, count: int = 4, **extra: object) -> JobConfig:
    return JobConfig.parse(
        name=JOB,
        at=datetime.fromtimestamp(at, UTC),
        sharding_total_count=count,
        sharding_wait_timeout=0.5,
        **extra,
    )


def _done(admin: MemoryStore) -> DoneRecord | None:
    node = admin.get(P.done)
    return DoneRecord.from_bytes(node.value, node.path) if node is not None else None


def _wait_done(admin: MemoryStore) -> DoneRecord:
    done = wait_until(lambda: _done(admin), 20, message="never done")
    assert done is not None
    return done


def _start(server: MemoryServer, job: ShardedJob, cfg: JobConfig) -> Runtime:
    rt = Runtime(server.store(), shutdown_grace=5)
    rt.add_job(job, cfg)
    return rt.start()


def test_on_time_fire_runs_each_item_once_then_done(
    server: MemoryServer, admin: MemoryStore
) -> None:
    """Two instances up at ``at``: the fire at ``at`` runs every item once across
    them, the job is recorded done, and an instance started afterwards runs nothing."""
    at = round(time.time() + 2.0, 3)
    jobs = [Recorder(), Recorder(), Recorder()]
    rts = [_start(server, jobs[n], _config(at)) for n in range(2)]
    try:
        done = _wait_done(admin)
        runs = [r for j in jobs for r in j.runs]
        assert sorted(item for _i, item, _f in runs) == [0, 1, 2, 3]
        assert all(abs(fire - at) < 1e-3 for _i, _item, fire in runs)
        assert done.is_for(at) and done.skipped == ()
        late = _start(server, jobs[2], _config(at))
        rts.append(late)
        # the late instance has looked (it knows the job is done) and ran nothing
        wait_until(lambda: late.runners[JOB].oneoff.done, 10, message="late never checked")
        assert jobs[2].runs == []
        assert late.next_fire_time(JOB) is None
        # operators see it done: status health, the trigger text, why no next fire
        ops = Operations(admin)
        (status,) = [j for j in ops.status().jobs if j.summary.name == JOB]
        assert status.health == "done"
        assert status.summary.trigger.endswith("(done)")
        assert status.summary.next_fire is None
        assert status.summary.next_fire_reason == "done"
        assert ops.job(JOB).next_fire_reason == "done"
    finally:
        for rt in rts:
            rt.stop_now()


def test_missed_fire_is_caught_up_once(server: MemoryServer, admin: MemoryStore) -> None:
    """Nobody was up at ``at`` (an hour ago): the first instance up runs every item
    once (a catch-up with one fire time for the cluster), then the job is done."""
    at = time.time() - 3600
    job = Recorder()
    assert Operations(admin).jobs() == []
    rt = _start(server, job, _config(at))
    try:
        assert Operations(admin).job(JOB).next_fire is None  # its time has passed
        wait_until(lambda: _done(admin), 20, message="never done")
        assert sorted(item for _i, item, _f in job.runs) == [0, 1, 2, 3]
        assert len({fire for _i, _item, fire in job.runs}) == 1  # one catch-up fire
        assert all(fire > at + 3000 for _i, _item, fire in job.runs)
        assert rt.runners[JOB].oneoff.done
    finally:
        rt.stop_now()


def test_missed_fire_with_misfire_off_is_skipped_and_done(
    server: MemoryServer, admin: MemoryStore
) -> None:
    """misfire=False: a one-off fire missed by more than the grace time is not run;
    the job is recorded done, every item listed as skipped."""
    at = time.time() - 3600
    job = Recorder()
    rt = _start(server, job, _config(at, misfire=False))
    try:
        done = _wait_done(admin)
        assert done.skipped == (0, 1, 2, 3)
        assert job.runs == []
    finally:
        rt.stop_now()


def test_operator_trigger_reruns_a_done_job(server: MemoryServer, admin: MemoryStore) -> None:
    """``shardkeeper trigger`` on a done one-off job runs every item again (an explicit
    re-run), and the job stays done."""
    at = time.time() - 3600
    job = Recorder()
    rt = _start(server, job, _config(at, count=2))
    try:
        done = _wait_done(admin)
        wait_until(lambda: len(job.runs) == 2, 5)
        Operations(admin).trigger(JOB)
        wait_until(lambda: len(job.runs) == 4, 10, message=lambda: f"runs: {job.runs}")
        assert sorted(item for _i, item, _f in job.runs[2:]) == [0, 1]
        assert _done(admin) == done
    finally:
        rt.stop_now()


def test_start_is_refused_once_the_item_completed(admin: MemoryStore) -> None:
    """The race the start condition closes: a fire read item 0 as outstanding, the item
    then completed elsewhere (its result written); that fire's start commit fails with
    reason "result" instead of running the item a second time."""
    at = time.time() - 10
    admin.put(P.sharding, b"")  # the start commit checks the assignment's version
    service = OneOffService(admin, P, "me")
    view = service.view(at)
    assert view.outstanding(2) == [0, 1]
    result = ItemResult("ok", at, at, at + 1, "other")
    admin.put(P.result(0), result.to_bytes())  # item 0 completed meanwhile
    execution = ExecutionService(admin, P, "me")
    version = admin.get(P.sharding)
    assert version is not None
    started = execution.start(
        [0],
        fire_time=at,
        execution_ids={0: "x#0"},
        assignment_version=version.version,
        persistent=False,
        monitor=True,
        item_checks=view.guards(P, [0]),
    )
    assert started.marked == () and started.reason == "result"
    assert service.view(at).outstanding(2) == [1]
    # item 1 is still outstanding: its guard holds and it is marked
    started = execution.start(
        [1],
        fire_time=at,
        execution_ids={1: "x#1"},
        assignment_version=version.version,
        persistent=False,
        monitor=True,
        item_checks=view.guards(P, [1]),
    )
    assert started.marked == (1,)
