"""Lifecycle races replayed on the MemoryStore's step hooks (no monkeypatching)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.registry.memory import MemoryServer, MemoryStore
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until
from shardkeeper.testing.jobs import RecordingJob

pytestmark = pytest.mark.timeout(60)

JOB = "life"
P = JobPaths(JOB)


class Probe(ShardedJob):
    """Records, per item run, whether the instance's membership node exists then (job
    classes live at module level: one defined in a function is refused)."""

    def __init__(self, observer: MemoryStore, present: list[tuple[int, bool]]) -> None:
        self.observer = observer
        self.present = present

    def execute(self, ctx: ShardingContext) -> None:
        self.present.append((ctx.item, self.observer.exists(P.instance(ctx.instance_id))))


class Noop(ShardedJob):
    """Does nothing."""

    def execute(self, ctx: ShardingContext) -> None:
        pass


@pytest.fixture
def server() -> Iterator[MemoryServer]:
    srv = MemoryServer()
    try:
        yield srv
    finally:
        srv.shutdown()


def test_graceful_stop_waits_for_a_trigger_that_is_marking_its_items(
    server: MemoryServer,
) -> None:
    """A graceful stop that came while a trigger was writing its running marks used to
    leave the job at once: the leader failed the items over and the taker ran them
    while this instance still did. The stop waits for that trigger's batch, and the
    items run while the instance is still a member."""
    observer = server.store()
    observer.start()
    present: list[tuple[int, bool]] = []
    rt = Runtime(server.store(), shutdown_grace=10)
    rt.add_job(
        Probe(observer, present),
        JobConfig(name=JOB, interval=0.5, sharding_total_count=2, failover=True),
    )
    # hold the first start commit (the one that writes running marks) before it applies
    held = server.pause("commit", path=P.running_root, thread="sk-coord")
    rt.start()
    stopper: threading.Thread | None = None
    try:
        assert held.wait_reached(10), "no trigger marked items"
        runner = rt.runners[JOB]
        stopper = threading.Thread(target=rt.stop, name="test-stop")
        stopper.start()
        # the stop has begun (no new triggers) while the trigger is still held
        wait_until(lambda: runner.running_count() >= 1 and runner.state.stopping, 5)
        held.release()
        stopper.join(30)
        assert not stopper.is_alive(), "stop did not finish"
    finally:
        held.release()
        rt.stop_now()
        if stopper is not None:
            stopper.join(30)
    assert present and all(ok for _, ok in present), present
    assert not observer.children(P.failover_queue), "items were failed over during the stop"


def test_a_removed_job_is_retired_not_registered_again(server: MemoryServer) -> None:
    """``remove --force`` deletes a job that instances still run. The level-triggered
    pass must not undo it by registering again: the instance stops running that job
    (and goes on with its others)."""
    admin = server.store()
    admin.start()

    rt = Runtime(server.store(), shutdown_grace=1)
    rt.add_job(Noop(), JobConfig(name=JOB, interval=0.3, sharding_total_count=1))
    rt.add_job(Noop(), JobConfig(name="other", interval=0.3, sharding_total_count=1))
    rt.start()
    try:
        removed, other = rt.runners[JOB], rt.runners["other"]
        wait_until(lambda: removed.stats["executed"] and other.stats["executed"], 10)
        admin.delete(P.root, recursive=True)
        wait_until(lambda: removed.state.stopping, 10, message="the job was not retired")
        passes = removed.repairs.passes
        ran = other.stats["executed"]
        wait_until(lambda: other.stats["executed"] > ran + 3, 10)
        assert not admin.exists(P.config), "the removed job's config was written again"
        assert removed.repairs.passes == passes  # retired: no pass rejoins it
        assert not admin.children(P.instances)
    finally:
        rt.stop_now()


def test_a_fire_during_registration_waits_for_it(server: MemoryServer) -> None:
    """A fire that came while the job was registering used to be skipped ("not
    registered") although the membership being written says the instance joined
    before that fire, so the leader could give it items for it: they never ran
    (found by the chaos checker). The fire now waits for the registration."""
    from datetime import UTC, datetime

    job = RecordingJob()
    rt = Runtime(server.store(), shutdown_grace=1)
    rt.add_job(job, JobConfig(name=JOB, cron="0 0 1 1 *", sharding_total_count=2))
    # a new job's membership is written by the registrar's batch commit
    held = server.pause("commit", path=P.instances)
    starter = threading.Thread(target=rt.start, name="test-start")
    starter.start()
    try:
        assert held.wait_reached(10), "registration never wrote the membership"
        runner = rt.runners[JOB]
        at = datetime.now(UTC)
        runner.on_trigger(at)
        wait_until(lambda: runner.pending_fires() == 1, 5)
        held.release()
        starter.join(10)
        runs = job.wait_for(lambda runs: sorted(r.item for r in runs) == [0, 1] and runs, 10)
        assert {r.fire_time for r in runs} == {at.timestamp()}
        assert runner.stats["skipped"] == 0
    finally:
        held.release()
        rt.stop_now()


class MembershipProbe(ShardedJob):
    """Records (instance, fire time, item, instance still a member) of each run."""

    def __init__(self, observer: MemoryStore, runs: list[tuple[str, float, int, bool]]) -> None:
        self.observer = observer
        self.runs = runs

    def execute(self, ctx: ShardingContext) -> None:
        present = self.observer.exists(P.instance(ctx.instance_id))
        self.runs.append((ctx.instance_id, ctx.fire_time.timestamp(), ctx.item, present))


def test_graceful_stop_waits_for_the_completion_commit(server: MemoryServer) -> None:
    """A graceful stop counted a batch as done once its items had returned, while its
    completion commit (marks cleared, result written) was still in flight: the stop
    closed the store under that commit, the marks stayed, and another instance ran
    the items again as a failover (seen in a loaded test run). The stop waits for the
    commit within the grace period; the marks are gone and the result is written."""
    observer = server.store()
    observer.start()
    job = RecordingJob()
    store = server.store()
    rt = Runtime(store, shutdown_grace=10)
    rt.add_job(job, JobConfig(name=JOB, interval=0.5, sharding_total_count=1, failover=True))
    # the first completion commit (it writes the item's result) is held on the worker
    held = server.pause("commit", path=P.result(0), store=store, thread="sk-worker")
    stopper = threading.Thread(target=rt.stop, name="test-stop")
    try:
        rt.start()
        assert held.wait_reached(10), "the item never completed"
        stopper.start()
        runner = rt.runners[JOB]
        wait_until(lambda: runner.state.stopping, 5)
        # the stop is still waiting for the held commit (it used to leave at once)
        stopper.join(1.0)
        assert stopper.is_alive(), "the stop left while a completion commit was in flight"
        held.release()
        stopper.join(30)
        assert not stopper.is_alive(), "stop did not finish"
    finally:
        held.release()
        rt.stop_now()
        if stopper.ident is not None:
            stopper.join(30)
    assert observer.exists(P.result(0)), "the completion commit never landed"
    assert observer.children(P.running_root) == [], "running marks left after the stop"
    observer.close()


def test_graceful_stop_still_runs_a_fire_that_waited_for_a_reshard(
    server: MemoryServer,
) -> None:
    """A fire of the stopping instance that was waiting for the leader's reshard when
    the stop came used to be dropped with the stop: its items were assigned to this
    instance for that fire and ran nowhere (chaos checker, the 600 s runs). A fire
    from before the stop is still decided in the grace period and its items run
    while the instance is still a member."""
    observer = server.store()
    observer.start()
    runs: list[tuple[str, float, int, bool]] = []
    config = JobConfig(
        name=JOB, interval=0.5, sharding_total_count=2, failover=True, sharding_wait_timeout=8
    )
    leader_store = server.store()
    leader = Runtime(leader_store, shutdown_grace=10)
    leader.add_job(MembershipProbe(observer, runs), config)
    leader.start()
    joiner = Runtime(server.store(), shutdown_grace=10)
    stopper: threading.Thread | None = None
    held = None
    try:
        wait_until(lambda: any(r[0] == leader.instance_id for r in runs), 10)
        # the leader's next reshard (the one that gives the joiner an item) is held
        held = server.pause("commit", path=P.sharding, store=leader_store)
        joiner.add_job(MembershipProbe(observer, runs), config)
        joiner.start()
        runner = joiner.runners[JOB]
        assert held.wait_reached(10), "the leader did not reshard for the joiner"
        # the joiner's fire waits for that reshard (queued on its lane, not in a step);
        # it may be queued ahead of its time (FIRE_LEAD): the stop comes once it is due
        wait_until(
            lambda: any(ft <= time.time() for ft in runner.pending_fire_times()),
            5,
            message="no fire of the joiner due and waiting for the reshard",
        )
        stopper = threading.Thread(target=joiner.stop, name="test-stop")
        stopper.start()
        wait_until(lambda: runner.state.stopping, 5)
        held.release()
        stopper.join(30)
        assert not stopper.is_alive(), "stop did not finish"
        stop_at = runner.state.stop_at
    finally:
        if held is not None:
            held.release()
        joiner.stop_now()
        leader.stop_now()
        if stopper is not None:
            stopper.join(30)
    mine = [r for r in runs if r[0] == joiner.instance_id]
    assert mine, "the joiner's fire from before the stop never ran its item"
    assert all(ft < stop_at for _i, ft, _item, _p in mine), mine
    assert all(present for *_rest, present in mine), "an item ran after the instance left"


def test_a_misfire_rerun_queued_during_another_is_never_run_twice(server: MemoryServer) -> None:
    """A misfire re-run queued while another fire was being decided used to go in
    front of it; that fire then stayed queued after it launched and, a misfire
    re-run being outside the schedule's duplicate guard, ran a second time (chaos
    checker, etcd seed 3003: one fire's items twice on one instance, a slow link)."""
    job = RecordingJob()
    rt = Runtime(server.store(), shutdown_grace=5)
    rt.add_job(job, JobConfig(name=JOB, cron="0 0 1 1 *", sharding_total_count=1))
    rt.start()
    held = None
    try:
        runner = rt.runners[JOB]
        wait_until(lambda: runner.state.registered, 10)
        first = time.time()  # after this instance joined (earlier fires are not its)
        second = first + 1
        held = server.pause("commit", path=P.running_root, thread="sk-coord")
        with runner.fires._fires_lock:
            runner.fires._queue_misfire_rerun(first, None)
        runner.submit("fires", runner.fires._pump)
        assert held.wait_reached(10), "the re-run never committed its marks"
        # a batch ended meanwhile and owes another re-run: queued behind this one
        with runner.fires._fires_lock:
            assert runner.fires._queue_misfire_rerun(second, None)
            assert not runner.fires._queue_misfire_rerun(second, None), "queued twice"
        held.release()
        wait_until(lambda: runner.pending_fires() == 0 and runner.idle, 10)
    finally:
        if held is not None:
            held.release()
        rt.stop()
    runs = sorted((round(r.fire_time, 3), r.item, r.is_misfire) for r in job.runs)
    assert runs == [(round(first, 3), 0, True), (round(second, 3), 0, True)], job.runs
