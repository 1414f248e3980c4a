"""``ctx.should_stop()`` is true only when this execution must end (issue 25 section 3).

A pending reshard used to make it true (job.py read the reshard flag): a second
instance joining stopped every running long item, and after an instance died the
failover re-runs of its items were told to stop at once (the death had set the
flag). Every one of them was recorded ``ok``: the work was simply gone. Now a reshard
is no reason to stop (the new assignment applies from the next fire), and the
leader does not wait for long items beyond ``execution_wait_timeout``.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.job import ShardingContext
from shardkeeper.observe import Outcome
from shardkeeper.registry.memory import MemoryServer
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until
from tests.runtime._holding import Execution, Holding, Records

pytestmark = pytest.mark.timeout(90)

JOB = "long"
P = JobPaths(JOB)


def _config(count: int, **extra: object) -> JobConfig:
    return JobConfig(
        name=JOB,
        interval=0.5,
        sharding_total_count=count,
        execution_wait_timeout=1.0,
        sharding_wait_timeout=1.0,
        **extra,  # type: ignore[arg-type]
    )


def test_a_join_during_long_items_neither_stops_them_nor_holds_the_reshard(
    memory_server: MemoryServer, runtimes: list[Runtime]
) -> None:
    """Four items of one instance poll should_stop() while a second instance joins:
    none is told to stop, all four are recorded ok, and the reshard is committed
    while they still run (from the next fire, past execution_wait_timeout), after
    which the joiner runs its new items."""
    admin = memory_server.store()
    admin.start()
    a_records, b_records = Records(), Records()
    rt_a = Runtime(memory_server.store(), shutdown_grace=1, worker_threads=8, observers=[a_records])
    job = Holding(
        hold=lambda ctx: ctx.instance_id == rt_a.instance_id,
        probe=lambda: admin.exists(P.necessary),
    )
    rt_a.add_job(job, _config(4))
    runtimes.append(rt_a)
    rt_a.start()

    def held() -> list[Execution]:
        return [r for r in job.runs if r.held]

    wait_until(lambda: len(held()) == 4, 15, message=lambda: f"4 items never ran: {job.runs}")
    first = held()
    rt_b = Runtime(memory_server.store(), shutdown_grace=1, worker_threads=8, observers=[b_records])
    rt_b.add_job(job, _config(4))
    runtimes.append(rt_b)
    rt_b.start()

    def b_owns_items() -> bool:
        assignment = rt_a.runners[JOB].assignment()
        return assignment is not None and rt_b.instance_id in assignment.owners.values()

    # the reshard is not held by the four items (nor stops them): it is committed
    # once execution_wait_timeout (1 s) has passed, while they still run
    wait_until(
        lambda: b_owns_items() or any(r.stopped for r in first),
        10,
        message="the reshard waited for the running items",
    )
    assert [r.stopped for r in first] == [None] * 4, "a reshard told running items to stop"
    assert all(r.probe_seen for r in first), "the join never set the reshard flag"
    assert not any(r.returned for r in first)
    assert b_owns_items()
    job.release.set()
    ids = [r.execution_id for r in first]
    wait_until(
        lambda: all(a_records.outcome_of(e) is not None for e in ids),
        10,
        message=lambda: f"outcomes: {[(e, a_records.outcome_of(e)) for e in ids]}",
    )
    assert [a_records.outcome_of(e) for e in ids] == [Outcome.OK] * 4
    released = time.time()
    wait_until(
        lambda: any(r.instance == rt_b.instance_id and r.fire_time > released for r in job.runs),
        10,
        message=lambda: f"the joiner never ran its items: {job.runs[-10:]}",
    )


def test_the_failover_run_of_a_death_is_not_told_to_stop_by_the_reshard_it_caused(
    memory_server: MemoryServer, runtimes: list[Runtime]
) -> None:
    """An instance dies while its item runs: the survivor's failover run of that item
    polls should_stop() while the reshard flag that the death set is pending. It
    used to be told to stop within milliseconds; it runs to its end and is ok."""
    admin = memory_server.store()
    admin.start()
    b_records = Records()
    rt_b = Runtime(memory_server.store(), shutdown_grace=1, worker_threads=4, observers=[b_records])
    a_store = memory_server.store(session_timeout=1.0)
    rt_a = Runtime(a_store, shutdown_grace=1, worker_threads=4)

    def hold(ctx: ShardingContext) -> bool:
        return ctx.is_failover or ctx.instance_id == rt_a.instance_id

    job = Holding(hold=hold, probe=lambda: admin.exists(P.necessary))
    cfg = _config(2, failover=True)
    rt_b.add_job(job, cfg)
    runtimes.append(rt_b)
    rt_b.start()
    wait_until(lambda: rt_b.runners[JOB].leader.is_leader and job.runs, 10)
    rt_a.add_job(job, cfg)
    runtimes.append(rt_a)
    rt_a.start()
    on_a = wait_until(
        lambda: [r for r in job.runs if r.instance == rt_a.instance_id and r.held],
        15,
        message=lambda: f"A never ran a held item: {job.runs[-10:]}",
    )[0]
    # A dies as after kill -9: its link is gone, the server ends its session (1 s)
    a_store.suspend()
    taken = wait_until(
        lambda: [r for r in job.runs if r.failover and r.execution_id == on_a.execution_id],
        15,
        message=lambda: f"A's item was not failed over: {job.runs[-10:]}",
    )[0]
    assert taken.instance == rt_b.instance_id
    # held while the flag of A's departure is pending (and the reshard waits, 1 s)
    wait_until(
        lambda: taken.stopped is not None or (taken.probe_seen and taken.polls >= 50),
        15,
        message=lambda: f"the failover run neither stopped nor saw the flag: {taken}",
    )
    assert taken.stopped is None, f"the failover run was told to stop: {taken.stopped}"
    job.release.set()
    wait_until(lambda: b_records.outcome_of(taken.execution_id, failover=True), 10)
    assert b_records.outcome_of(taken.execution_id, failover=True) is Outcome.OK


@pytest.mark.parametrize("cause", ["timeout", "fenced"])
def test_stop_reason_says_timeout_or_fenced(
    memory_server: MemoryServer, runtimes: list[Runtime], cause: str
) -> None:
    """The two other reasons, each from its own cause: an execution past
    ``execution_timeout`` is told "timeout"; one whose instance stops hearing from
    the store (its session may be expiring) is told "fenced". (``stop_reason()`` is
    new: it does not exist on 3005b15.)"""
    store = memory_server.store(session_timeout=1.0)
    job = Holding(hold=lambda ctx: True)
    rt = Runtime(store, shutdown_grace=1, worker_threads=4)
    timeout = 0.3 if cause == "timeout" else None
    config = JobConfig(
        name=JOB, cron="0 0 1 1 *", sharding_total_count=2, execution_timeout=timeout
    )
    rt.add_job(job, config)
    runtimes.append(rt)
    rt.start()
    runner = rt.runners[JOB]
    wait_until(lambda: runner.state.registered, 10)
    runner.on_trigger(datetime.now(UTC))
    wait_until(lambda: len(job.runs) == 2 and all(r.polls > 0 for r in job.runs), 10)
    if cause == "fenced":
        store.suspend()  # the link is gone: is_valid() turns false
    try:
        wait_until(lambda: all(r.returned for r in job.runs), 10)
    finally:
        job.release.set()
        if cause == "fenced":
            store.resume()
    assert [r.stopped for r in job.runs] == [cause, cause]
