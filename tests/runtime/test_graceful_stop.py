"""A graceful stop loses nothing (issue 25 section 3, review finding 6).

* An item that returns after ``ctx.should_stop()`` told it the grace period runs out
  may have left its work half-done: it is recorded ``interrupted`` (it used to be
  ``ok``, and the work was gone), and its item runs again: with failover on, handed
  to failover and run elsewhere at once; with failover off, at its next owner's next
  fire.
* A completion commit that failed just before (or during) the stop is retried within
  the grace period: the stop used to leave with it unsettled, the leader failed the
  marks of items that had run over, and they ran again elsewhere.
"""

from __future__ import annotations

import threading
import time

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.model import RunningMark
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.job import ShardingContext, StopReason
from shardkeeper.observe import Outcome
from shardkeeper.registry.memory import MemoryServer, MemoryStore
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until
from tests.runtime._holding import Holding, Records

pytestmark = pytest.mark.timeout(90)

JOB = "graceful"
P = JobPaths(JOB)


def _config(failover: bool) -> JobConfig:
    return JobConfig(
        name=JOB,
        interval=0.5,
        sharding_total_count=2,
        failover=failover,
        execution_wait_timeout=1.0,
    )


def _pair(
    server: MemoryServer, runtimes: list[Runtime], failover: bool, a_holds: bool = True
) -> tuple[Runtime, Runtime, Holding, Records]:
    """B (never holds) starts first and leads; then A joins, whose own (not failover)
    executions are held while ``a_holds``. Returns (A, B, job, A's records) once A
    runs an item."""
    a_records = Records()
    rt_b = Runtime(server.store(), shutdown_grace=1, worker_threads=4)
    rt_a = Runtime(server.store(), shutdown_grace=10, worker_threads=4, observers=[a_records])

    def hold(ctx: ShardingContext) -> bool:
        return a_holds and ctx.instance_id == rt_a.instance_id and not ctx.is_failover

    job = Holding(hold=hold)
    rt_b.add_job(job, _config(failover))
    runtimes.append(rt_b)
    rt_b.start()
    wait_until(lambda: rt_b.runners[JOB].leader.is_leader and job.runs, 10)
    rt_a.add_job(job, _config(failover))
    runtimes.append(rt_a)
    rt_a.start()
    wait_until(
        lambda: any(r.instance == rt_a.instance_id for r in job.runs),
        15,
        message=lambda: f"A never ran an item: {job.runs[-10:]}",
    )
    return rt_a, rt_b, job, a_records


def _marks_of(store: MemoryStore, instance: str) -> list[int]:
    """Items whose running mark names ``instance``."""
    items = []
    for name in store.children(P.running_root):
        node = store.get(P.running(int(name)))
        if node is not None and RunningMark.from_bytes(node.value).instance_id == instance:
            items.append(int(name))
    return items


def _stop_in_background(rt: Runtime, grace: float | None = None) -> threading.Thread:
    stopper = threading.Thread(target=lambda: rt.stop(grace), name="test-graceful-stop")
    stopper.start()
    return stopper


@pytest.mark.parametrize("failover", [True, False], ids=["failover", "no-failover"])
def test_an_item_that_returns_when_told_to_stop_is_interrupted_and_runs_again(
    memory_server: MemoryServer, runtimes: list[Runtime], failover: bool
) -> None:
    """A graceful stop (grace 2 s) while A's item polls should_stop() and would
    outlast it: as the grace runs out it is told "shutdown grace ending", returns, is
    recorded interrupted (not ok), and the item runs again on B: the same execution
    as a failover run (failover on), or at B's next fire of it once it owns it
    (failover off). Nothing is left marked."""
    admin = memory_server.store()
    admin.start()
    rt_a, rt_b, job, a_records = _pair(memory_server, runtimes, failover)
    held = wait_until(
        lambda: [r for r in job.runs if r.instance == rt_a.instance_id and r.held], 10
    )[0]
    stopper = _stop_in_background(rt_a, grace=2.0)
    try:
        wait_until(lambda: held.returned, 10, message="the held item was never told to stop")
        wait_until(lambda: a_records.outcome_of(held.execution_id) is not None, 10)
        # compared as text: the outcome is new (3005b15 recorded "ok")
        assert a_records.outcome_of(held.execution_id) == "interrupted"
        assert held.stopped == StopReason.SHUTDOWN.value  # "shutdown grace ending"
        stopper.join(30)
        assert not stopper.is_alive(), "the graceful stop did not finish"
        stopped_at = time.time()
        if failover:
            again = wait_until(
                lambda: [r for r in job.runs if r.execution_id == held.execution_id and r.failover],
                10,
                message=lambda: f"the interrupted item was not run again: {job.runs[-10:]}",
            )
            assert again[0].instance == rt_b.instance_id
        else:
            wait_until(
                lambda: any(
                    r.item == held.item
                    and r.instance == rt_b.instance_id
                    and r.fire_time > stopped_at
                    for r in job.runs
                ),
                10,
                message=lambda: f"the item never ran on B afterwards: {job.runs[-10:]}",
            )
            assert not admin.children(P.failover_queue)
        wait_until(
            lambda: not _marks_of(admin, rt_a.instance_id),
            10,
            message="a mark of the stopped instance was left",
        )
    finally:
        job.release.set()
        stopper.join(30)


def test_an_item_that_ignores_should_stop_is_ok_after_a_graceful_stop(
    memory_server: MemoryServer, runtimes: list[Runtime]
) -> None:
    """The other side of the rule: an item that never asked should_stop() and ends
    within the grace period did its work: ok, and not run again."""
    rt_a, _rt_b, job, a_records = _pair(memory_server, runtimes, failover=True, a_holds=False)
    stopper = _stop_in_background(rt_a)
    stopper.join(30)
    assert not stopper.is_alive()
    mine = [r for r in job.runs if r.instance == rt_a.instance_id]
    assert mine
    outcomes = {a_records.outcome_of(r.execution_id) for r in mine}
    assert outcomes == {Outcome.OK}, outcomes
    left = time.time()
    wait_until(lambda: any(r.fire_time > left for r in job.runs), 10)
    assert not any(r.failover for r in job.runs)


def test_a_graceful_stop_retries_a_failed_completion_commit_before_it_leaves(
    memory_server: MemoryServer, runtimes: list[Runtime]
) -> None:
    """Finding 6: A's completion commit fails once (a timeout) just before the stop.
    The stop retries it within the grace period and leaves only then: B runs none of
    A's items as a failover run, and no mark is left."""
    admin = memory_server.store()
    admin.start()
    rt_a, rt_b, job, _records = _pair(memory_server, runtimes, failover=True)
    held = wait_until(
        lambda: [r for r in job.runs if r.instance == rt_a.instance_id and r.held], 10
    )[0]
    runner_a = rt_a.runners[JOB]
    a_store = runner_a.services.store
    # the next commit of A under running/ is this batch's completion (its later fires
    # find the item running here: misfires, no start commit)
    a_store.fail_next("commit", path=P.running_root)  # type: ignore[attr-defined]
    job.release.set()
    wait_until(
        lambda: runner_a.batches.unfinished(), 10, message="the completion commit did not fail"
    )
    stopper = _stop_in_background(rt_a)
    stopper.join(30)
    assert not stopper.is_alive(), "the graceful stop did not finish"
    # B leads: had A left its mark behind, B would have requeued it as A left, and
    # run it as failover before its own next fire of the item
    left = time.time()
    wait_until(
        lambda: any(
            r.instance == rt_b.instance_id and r.item == held.item and r.fire_time > left
            for r in job.runs
        ),
        10,
        message=lambda: f"B never ran the item after A left: {job.runs[-10:]}",
    )
    assert not _marks_of(admin, rt_a.instance_id)
    assert not admin.children(P.failover_queue)
    assert not [r for r in job.runs if r.failover], "A's completed item ran again as failover"
    assert not runner_a.batches.unfinished(), "the stop left a failed completion unsettled"


def test_an_item_that_returns_after_the_grace_period_ended_runs_again(
    memory_server: MemoryServer, runtimes: list[Runtime]
) -> None:
    """An item still running when the grace period ends is fenced (ctx.is_valid()
    false); one that then returns without looking ran while invalid: recorded
    ``fenced``, handed to failover and run again on B, never counted done. Before,
    the hard stop made it invalid without a fence time, such a run counted done, and
    the fires its run stood for were lost (600 s ZooKeeper run: a bulk item that
    returned 6 ms after the grace period ended).

    A's hard stop is held until the item returned (the item is released right after
    the fence), so the return falls between the fence and A leaving, as it did."""
    rt_a, rt_b, job, a_records = _pair(memory_server, runtimes, failover=True, a_holds=False)
    runner_a = rt_a.runners[JOB]
    gate = threading.Event()
    returned = threading.Event()
    item_started = threading.Event()
    real_execute = job.execute

    def execute(ctx: ShardingContext) -> None:
        if ctx.instance_id == rt_a.instance_id and not ctx.is_failover and not gate.is_set():
            gate.set()
            item_started.set()
            # the user's item that never asks is_valid() or should_stop()
            job.release.wait(30)
            real_execute(ctx)
            returned.set()
            return
        real_execute(ctx)

    job.execute = execute  # type: ignore[method-assign]
    wait_until(item_started.is_set, 15, message="A started no item")
    real_begin_stop = runner_a.begin_stop

    def begin_stop(hard: bool = False, notice_at: float | None = None) -> None:
        real_begin_stop(hard, notice_at)
        if hard:
            job.release.set()  # it returns now, fenced, before A leaves
            returned.wait(10)

    runner_a.begin_stop = begin_stop  # type: ignore[method-assign]
    stopper = threading.Thread(target=lambda: rt_a.stop(grace=0.3), name="test-hard-stop")
    stopper.start()
    try:
        stopper.join(30)
        assert not stopper.is_alive(), "the stop did not finish"
        assert returned.is_set(), "the held item never returned"
        ran = [r for r in job.runs if r.instance == rt_a.instance_id and not r.failover]
        held = ran[-1]
        assert a_records.outcome_of(held.execution_id) == Outcome.FENCED, a_records.executions[-5:]
        again = wait_until(
            lambda: [r for r in job.runs if r.execution_id == held.execution_id and r.failover],
            10,
            message=lambda: f"the fenced item was not run again: {job.runs[-10:]}",
        )
        assert again[0].instance == rt_b.instance_id
    finally:
        job.release.set()
        stopper.join(30)
