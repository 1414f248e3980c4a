"""The self-repairing core, replayed deterministically on the reference MemoryStore.

Each test forces one interleaving or fault that left a job stopped or an item run
twice before the core became level-triggered (issue 9 section 5, issue 15 items
1-5). The store is the in-process MemoryStore with its step hooks; nothing of the
runtime is monkeypatched. The real stores are exercised by tests/jobs and the chaos
runs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.model import Assignment, RunningMark
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.errors import ConfigError, OperationTimeoutError
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.registry.base import Check, Delete
from shardkeeper.registry.memory import MemoryServer, MemoryStore
from shardkeeper.runtime import Runtime
from shardkeeper.runtime.fire.trigger import Fire
from shardkeeper.testing.faults import wait_until

pytestmark = pytest.mark.timeout(90)

JOB = "repair"
P = JobPaths(JOB)


class Recording(ShardedJob):
    """Records (fire time, item, valid) of every execution; can hold item runs."""

    def __init__(self, hold: set[int] | None = None, work: float = 0.0) -> None:
        self.work = work
        self.runs: list[tuple[float, int, bool, bool]] = []
        self.lock = threading.Lock()
        self.hold = hold or set()
        self.release = threading.Event()
        self.started = threading.Event()

    def execute(self, ctx: ShardingContext) -> None:
        if ctx.item in self.hold and not self.release.is_set():
            self.started.set()
            self.release.wait(20)
        if self.work:
            time.sleep(self.work)  # the item's own work: keeps a batch in progress
        with self.lock:
            self.runs.append((ctx.fire_time.timestamp(), ctx.item, ctx.is_valid(), ctx.is_failover))

    def items_after(self, t: float) -> set[int]:
        with self.lock:
            return {i for ft, i, _v, _f in self.runs if ft > t}

    def count(self, item: int) -> int:
        with self.lock:
            return sum(1 for _ft, i, _v, _f in self.runs if i == item)


@pytest.fixture
def server() -> Iterator[MemoryServer]:
    srv = MemoryServer()
    try:
        yield srv
    finally:
        srv.shutdown()


def start(
    runtimes: list[Runtime],
    store: MemoryStore,
    job: ShardedJob,
    config: JobConfig | None = None,
    **kwargs: Any,
) -> Runtime:
    rt = Runtime(store, shutdown_grace=1, **kwargs)
    rt.add_job(job, config or cfg())
    rt.start()
    runtimes.append(rt)
    return rt


def cfg(**over: Any) -> JobConfig:
    base: dict[str, Any] = {
        "name": JOB,
        "interval": 0.5,
        "sharding_total_count": 2,
        "failover": True,
        "sharding_wait_timeout": 3,
        "execution_wait_timeout": 3,
    }
    base.update(over)
    return JobConfig(**base)


def test_fenced_items_that_never_started_are_handed_to_failover(
    server: MemoryServer, runtimes: list[Runtime]
) -> None:
    """A fenced batch's items that never started used to keep their running marks for
    good while the session lived (nothing requeues a live owner's marks): the job
    stopped. Now they go to failover by a conditional commit and run again."""
    job = Recording(hold={0})
    rt = start(runtimes, server.store(), job, cfg(max_threads=1), worker_threads=2)
    runner = rt.runners[JOB]
    assert job.started.wait(10), "item 0 never started"
    fenced_at = time.time()
    runner.fence_all()  # what a stale freshness clock does
    job.release.set()
    # item 1 of that batch never ran under the fenced batch: its mark is not stranded;
    # item 0 ran while fenced (told it is invalid): it runs again, as a failover run
    wait_until(
        lambda: {1} <= {i for ft, i, v, _f in job.runs if v and time.time() > fenced_at},
        15,
        message=lambda: f"item 1 never ran validly again: {job.runs}",
    )
    wait_until(
        lambda: any(i == 0 and f and v for _ft, i, v, f in job.runs),
        15,
        message=lambda: f"item 0 (ran fenced) was not run again validly: {job.runs}",
    )
    wait_until(lambda: job.items_after(fenced_at + 0.5) == {0, 1}, 15)


def test_a_short_session_timeout_works(server: MemoryServer, runtimes: list[Runtime]) -> None:
    """session_timeout=1 used to fence every execution every second (the 1 s tick
    looked like a freeze). Now the cadence is T/3 and executions stay valid."""
    job = Recording(work=0.3)
    t0 = time.time()
    rt = start(runtimes, server.store(session_timeout=1.0), job)
    wait_until(lambda: job.items_after(t0 + 2.5) == {0, 1}, 15)
    assert all(valid for _ft, _i, valid, _f in job.runs), job.runs
    assert rt.runners[JOB].stats["fenced"] == 0


def test_a_session_timeout_too_short_for_the_cadence_is_refused(server: MemoryServer) -> None:
    """A timeout below the minimum is refused at start with the value named."""
    rt = Runtime(server.store(session_timeout=0.3))
    rt.add_job(Recording(), cfg())
    with pytest.raises(ConfigError, match=r"session_timeout=0\.3"):
        rt.start()


def test_a_missed_member_left_event_does_not_strand_orphan_marks(
    server: MemoryServer, runtimes: list[Runtime]
) -> None:
    """A running mark of an instance that is gone, with no event at all (the leader
    was suspended or one store call failed when the member left), used to stay
    forever and every reshard waited for it. The leader's pass requeues it."""
    job = Recording()
    admin = server.store()
    admin.start()
    rt = start(runtimes, server.store(), job, cfg(sharding_total_count=3))
    wait_until(lambda: rt.runners[JOB].leader.is_leader and job.runs, 10)
    # a mark naming a ghost (running/ is not watched: no event will ever come for it)
    ghost = "ghost@1@dead"
    mark = RunningMark(ghost, time.time() - 5, f"{JOB}@1#0")
    wait_until(lambda: not admin.exists(P.running(0)), 5)
    admin.create(P.running(0), mark.to_bytes())
    t0 = time.time()
    wait_until(
        lambda: job.items_after(t0) == {0, 1, 2},
        15,
        message=lambda: f"runs {job.runs}, marks {admin.children(P.running_root)}",
    )
    # the ghost's mark went through failover: run once as a failover execution
    assert any(f for _ft, i, _v, f in job.runs if i == 0), job.runs


def test_an_unreadable_mark_is_repaired(server: MemoryServer, runtimes: list[Runtime]) -> None:
    """A running mark that cannot be decoded blocked its item forever; status said ok."""
    job = Recording()
    admin = server.store()
    admin.start()
    start(runtimes, server.store(), job)
    wait_until(lambda: job.runs, 10)
    wait_until(lambda: admin.create(P.running(1), b"\x00 not json") is not None, 5)
    t0 = time.time()
    wait_until(lambda: job.items_after(t0 + 1) == {0, 1}, 15)
    assert admin.get(P.running(1)) is None or admin.get(P.running(1)).value != b"\x00 not json"  # type: ignore[union-attr]


def test_an_assignment_naming_only_dead_instances_is_repaired(
    server: MemoryServer, runtimes: list[Runtime]
) -> None:
    """An assignment that names only instances that are gone (and no reshard flag)
    waited for the 600 s reconcile; the leader's pass now sets the flag at once."""
    job = Recording()
    admin = server.store()
    admin.start()
    stale = Assignment(total=2, owners={0: "ghost@1@a", 1: "ghost@1@a"}, generation=7)
    rt = start(runtimes, server.store(), job)
    runner = rt.runners[JOB]
    wait_until(lambda: runner.leader.is_leader and not admin.exists(P.necessary), 10)
    admin.put(P.sharding, stale.to_bytes())
    t0 = time.time()
    wait_until(lambda: job.items_after(t0 + 0.5) == {0, 1}, 15)


def test_lost_reconnect_read_does_not_leave_the_job_without_a_leader(
    server: MemoryServer, runtimes: list[Runtime]
) -> None:
    """A failed read on RECONNECTED dropped leadership although the leader node still
    named us: nobody led (no reshard, no requeue). The pass re-reads the node."""
    store = server.store()
    job = Recording()
    rt = start(runtimes, store, job)
    runner = rt.runners[JOB]
    wait_until(lambda: runner.leader.is_leader, 10)
    store.suspend()
    wait_until(lambda: not runner.leader.is_leader, 5)
    store.fail_next("get", path=P.leader)
    store.resume()
    wait_until(lambda: runner.leader.is_leader, 10, message="leadership never came back")
    # and it acts as leader: a new member gets items after a reshard
    other = Recording()
    t0 = time.time()
    start(runtimes, server.store(), other)
    wait_until(lambda: other.items_after(t0), 15, message="the new member never got items")


def test_reregistration_goes_on_past_a_failing_job(
    server: MemoryServer, runtimes: list[Runtime]
) -> None:
    """After a new session, re-registration stopped at the first job that failed;
    later jobs skipped every trigger ("not connected"). Each job now registers on its
    own and a failed one is retried."""
    store = server.store()
    a, b = Recording(), Recording()
    rt = Runtime(store, shutdown_grace=1)
    rt.add_job(a, cfg(name="a-job"))
    rt.add_job(b, cfg(name="b-job"))
    rt.start()
    runtimes.append(rt)
    wait_until(lambda: a.runs and b.runs, 10)
    # the next two writes of a-job's membership fail
    store.fail_next("put", path=JobPaths("a-job").instance(rt.instance_id), count=2)
    store.expire()
    t0 = time.time()
    wait_until(
        lambda: a.items_after(t0 + 0.5) == {0, 1} and b.items_after(t0 + 0.5) == {0, 1},
        15,
        message=lambda: f"a {a.runs[-4:]} b {b.runs[-4:]}",
    )


def test_requeue_from_a_stale_member_view_cannot_move_a_live_mark(server: MemoryServer) -> None:
    """The leader's requeue is conditional on the owner's membership being absent: a
    decision taken from a stale list of members (the owner re-registered under the
    same id meanwhile) moves nothing."""
    from shardkeeper.coordination.failover import FailoverService

    store = server.store()
    store.start()
    owner = "host@1@back"
    store.put(P.instance(owner), b"{}", ephemeral=True)
    store.put(P.running(0), RunningMark(owner, time.time(), f"{JOB}@1#0").to_bytes())
    leader = FailoverService(store, P, "host@2@leader")
    assert leader.requeue_orphans(live=set()) == []  # the stale view: owner not live
    assert store.exists(P.running(0))
    assert not store.children(P.failover_queue)
    store.delete(P.instance(owner))
    assert leader.requeue_orphans(live=set()) == [0]


def test_a_start_commit_whose_reply_was_lost_is_adopted(
    server: MemoryServer, runtimes: list[Runtime]
) -> None:
    """A start commit applied by the store whose reply was lost left marks naming a
    live instance; later triggers took them for another instance's and the job
    stopped. The marks are read back and adopted (or handed to failover)."""
    store = server.store()
    job = Recording()
    rt = start(runtimes, store, job)
    wait_until(lambda: job.runs, 10)
    store.fail_next("commit", path=P.running_root, applied=True, error=OperationTimeoutError)
    t0 = time.time()
    wait_until(lambda: job.items_after(t0 + 1.5) == {0, 1}, 15)
    runner = rt.runners[JOB]
    assert runner.stats["skipped"] == 0, runner.stats


def test_one_jobs_long_wait_does_not_delay_another(
    server: MemoryServer, runtimes: list[Runtime]
) -> None:
    """A job waiting (bounded) for a reshard that does not come held a shared
    coordinator thread; with few threads every other job stopped firing. Waits now
    re-submit themselves on the job's lane."""
    admin = server.store()
    admin.start()
    stuck = JobPaths("stuck")
    # a leader that never reshards: the flag stays and followers wait
    admin.put(stuck.leader, b"ghost@1@x", ephemeral=True)
    admin.put(stuck.necessary, b"forever")
    fast = Recording()
    rt = Runtime(server.store(), shutdown_grace=1, coordinator_threads=1)
    rt.add_job(Recording(), cfg(name="stuck", sharding_wait_timeout=30))
    rt.add_job(fast, cfg(name="fast", interval=0.3))
    rt.start()
    runtimes.append(rt)
    t0 = time.time()
    wait_until(lambda: len([r for r in fast.runs if r[0] > t0]) >= 10, 15)
    assert rt.runners["stuck"].pending_fires() >= 1  # it is still waiting


def test_completion_failure_is_retried_and_the_misfire_runs(
    server: MemoryServer, runtimes: list[Runtime]
) -> None:
    """A completion commit that failed left the marks; the retry clears them and the
    item runs again at later triggers (no reshard or session change needed)."""
    store = server.store()
    job = Recording()
    start(runtimes, store, job)
    wait_until(lambda: job.runs, 10)
    store.fail_next("commit", path=P.running_root, count=2)
    t0 = time.time()
    wait_until(lambda: job.items_after(t0 + 2) == {0, 1}, 15)
    wait_until(lambda: not store.children(P.running_root) or job.items_after(t0 + 3), 10)


def test_a_deleted_membership_node_fences_and_reregisters(
    server: MemoryServer, runtimes: list[Runtime]
) -> None:
    """If our membership node is gone while the session lives (an operator deleted
    it), the leader may requeue our marks: our executions are fenced, and we join
    again by ourselves."""
    store = server.store()
    admin = server.store()
    admin.start()
    job = Recording(hold={0})
    rt = start(runtimes, store, job, cfg(sharding_total_count=1))
    assert job.started.wait(10)
    runner = rt.runners[JOB]
    admin.commit(
        [Check(P.instance(rt.instance_id), exists=True), Delete(P.instance(rt.instance_id))]
    )
    wait_until(lambda: runner.batches.busy_items() == set() or runner.stats["fenced"] > 0, 10)
    job.release.set()
    wait_until(lambda: admin.exists(P.instance(rt.instance_id)), 10, message="never re-registered")
    t0 = time.time()
    wait_until(lambda: job.items_after(t0) == {0}, 15)


def test_a_busy_instance_claims_orphans_into_free_worker_slots(
    server: MemoryServer, runtimes: list[Runtime]
) -> None:
    """Orphans used to be claimed only by an instance with no batch of the job at
    all: with items longer than the interval a killed instance's items were never
    claimed. A free worker slot is enough now."""
    admin = server.store()
    admin.start()
    job = Recording(hold={0})
    rt = start(runtimes, server.store(), job, cfg(sharding_total_count=1), worker_threads=4)
    assert job.started.wait(10), "item 0 never started"
    runner = rt.runners[JOB]
    wait_until(lambda: runner.leader.is_leader, 10)
    # a dead instance's running item 5 (the job had more items before a reshard)
    ghost = RunningMark("ghost@1@dead", time.time() - 3, f"{JOB}@1#5")
    admin.create(P.running(5), ghost.to_bytes())
    wait_until(
        lambda: any(i == 5 and f for _ft, i, _v, f in job.runs),
        15,
        message=lambda: f"orphan 5 not claimed while item 0 runs: {job.runs}",
    )
    assert not job.release.is_set() and runner.batches.busy_items() >= {0}
    job.release.set()


def test_an_exception_that_is_not_a_store_error_in_completion_loses_nothing(
    server: MemoryServer, runtimes: list[Runtime], caplog: pytest.LogCaptureFixture
) -> None:
    """Worker tasks' exceptions were never read, and one that was not a StoreError in
    completion silently skipped the misfire re-run, claims and the batch's removal:
    the job stopped. Now completion always ends its batch, the error is logged, and
    the worker thread lives on."""
    from shardkeeper.job import JobListener

    class Exploding(JobListener):
        def __init__(self) -> None:
            self.calls = 0

        def after_job(self, contexts: Sequence[ShardingContext]) -> None:
            self.calls += 1
            if self.calls == 1:
                raise SystemExit("a listener that exits")  # not even an Exception

    job = Recording(work=0.6)  # longer than the interval: the next fire is a misfire
    listener = Exploding()
    rt = Runtime(server.store(), shutdown_grace=1, worker_threads=2)
    rt.add_job(job, cfg(interval=0.5), listeners=[listener])
    rt.start()
    runtimes.append(rt)
    wait_until(lambda: listener.calls >= 1, 10)
    t0 = time.time()
    wait_until(lambda: job.items_after(t0) == {0, 1}, 15, message=lambda: f"{job.runs}")
    assert rt.runners[JOB].stats["misfires"] >= 1
    assert any("task failed" in r.getMessage() for r in caplog.records)
    workers = [t for t in threading.enumerate() if t.name.startswith("sk-worker")]
    assert len(workers) == 2


def test_marks_of_an_execution_that_already_ran_here_are_cleared_not_failed_over(
    server: MemoryServer, runtimes: list[Runtime]
) -> None:
    """A start commit that timed out can be applied by the store after the retried
    one ran and cleared its items (etcd applies a proposal that was in flight when
    its leader was lost, once a new leader is elected): marks naming this instance
    reappear for an execution that already ran here. The repair pass used to hand
    them to failover, which ran that fire a second time (chaos checker, etcd seed
    3003). They are cleared; marks of an execution that did not run here still go to
    failover."""
    store = server.store()
    job = Recording()
    rt = start(runtimes, store, job, cfg(cron="0 0 1 1 *", interval=None))  # fires when told
    runner = rt.runners[JOB]
    wait_until(lambda: runner.state.registered, 10)
    runner.on_trigger(datetime.now(UTC))
    wait_until(lambda: len(job.runs) >= 2 and runner.idle, 10)
    fire_time, item = job.runs[0][0], job.runs[0][1]
    ran = f"{JOB}@{round(fire_time * 1000)}#{item}"
    assert runner.batches.ran_here(ran)
    late = RunningMark(rt.instance_id, fire_time, ran)
    store.put(P.running(item), late.to_bytes())
    store.put(f"{P.running(item)}/fence-late", b"")
    other = 1 - item
    stray = RunningMark(rt.instance_id, fire_time - 30, f"{JOB}@1#{other}")
    store.put(P.running(other), stray.to_bytes())
    store.put(f"{P.running(other)}/fence-stray", b"")
    runner.state.marks_suspect = True
    runner.request_repair()
    wait_until(lambda: not store.exists(P.running(item)), 10, message="late mark kept")
    wait_until(lambda: store.children(P.failover_queue) == [str(other)] or job.count(other) > 1, 10)
    assert job.count(item) == 1, "the execution that ran here ran again"


def test_marks_of_a_fire_still_being_decided_here_are_left_to_that_fire(
    server: MemoryServer, runtimes: list[Runtime]
) -> None:
    """A start commit whose outcome was unknown (nothing found when read back) can be
    applied later, while its fire waits to be decided again. The repair pass used to
    hand those marks to failover: the fire's next attempt then met no mark, ran the
    items, and the failover claim ran them a second time (chaos checker, etcd seed
    21404). The pass leaves them to the fire, whose next attempt adopts them: each
    item runs once, and nothing goes to the failover queue."""
    store = server.store()
    job = Recording()
    rt = start(runtimes, store, job, cfg(cron="0 0 1 1 *", interval=None))  # fires when told
    runner = rt.runners[JOB]
    wait_until(lambda: runner.state.registered, 10)
    runner.on_trigger(datetime.now(UTC))  # a first fire: the assignment is in place
    wait_until(lambda: len(job.runs) >= 2 and runner.idle, 10)
    fire_time = round(time.time(), 3)
    # the fire is queued here, its decision still to come (as after an unknown outcome)
    with runner.fires._fires_lock:
        runner.fires._fires.append(Fire(fire_time))
    for item in (0, 1):
        late = RunningMark(rt.instance_id, fire_time, f"{JOB}@{round(fire_time * 1000)}#{item}")
        store.put(P.running(item), late.to_bytes())
        store.put(f"{P.running(item)}/fence-late{item}", b"")
    # a housekeeping pass on the lane with the marks suspect (a pass checks them)
    repaired: list[list[str]] = []
    runner.state.marks_suspect = True
    runner.submit(None, lambda: repaired.append(runner.repairs.run()))
    wait_until(lambda: repaired, 10)
    assert not store.children(P.failover_queue), "the fire's marks went to failover"
    assert store.exists(P.running(0)) and store.exists(P.running(1))
    # the fire's next attempt adopts them and runs each item once
    runner.submit("fires", runner.fires._pump)
    wait_until(lambda: job.count(0) >= 1 and job.count(1) >= 1 and runner.idle, 10)
    wait_until(lambda: not store.exists(P.running(0)) and not store.exists(P.running(1)), 10)
    assert (job.count(0), job.count(1)) == (2, 2), job.runs  # the first fire, then this
    assert not store.children(P.failover_queue)
