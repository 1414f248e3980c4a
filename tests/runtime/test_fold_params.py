"""Folding a queued run-now keeps its params (review finding 16).

Fires that pile up behind one still being decided are folded: the oldest waiting one
became a plain misfire re-run. When that was an operator's run-now with params (or
a one-off job's catch-up of some items), its params and items were lost: the re-run
ran every item with ``ctx.params`` empty. Plain fires of the schedule give way now;
a request keeps its place.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.model import RunningMark
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.registry.base import Delete
from shardkeeper.registry.memory import MemoryServer
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until
from shardkeeper.testing.jobs import RecordingJob
from tests.runtime._holding import Holding

pytestmark = pytest.mark.timeout(60)

JOB = "fold"
P = JobPaths(JOB)
PARAMS = {"region": "eu-west", "dry_run": "1"}


def test_a_run_now_folded_behind_a_waiting_fire_keeps_its_params(
    memory_server: MemoryServer, runtimes: list[Runtime]
) -> None:
    """The fire in progress waits in the leader's reshard wait (the flag set, an item
    of a live member running); a run-now with params is queued behind it, then two
    fires of the schedule. Released, the run-now runs with its params."""
    admin = memory_server.store()
    admin.start()
    job = RecordingJob()
    rt = Runtime(memory_server.store(), shutdown_grace=1)
    cfg = JobConfig(
        name=JOB,
        cron="0 0 1 1 *",  # fires only when the test says so
        sharding_total_count=2,
        execution_wait_timeout=30.0,
        sharding_wait_timeout=30.0,
    )
    rt.add_job(job, cfg)
    runtimes.append(rt)
    rt.start()
    runner = rt.runners[JOB]
    wait_until(lambda: runner.state.registered and runner.leader.is_leader, 10)
    runner.on_trigger(datetime.now(UTC))  # a first fire: the assignment is in place
    wait_until(lambda: len(job.runs) == 2 and runner.idle, 10)
    # a live member's running item holds the leader's reshard (for 30 s)
    admin.put(P.instance("other"), b"{}", ephemeral=True)
    admin.put(P.running(5), RunningMark("other", time.time(), f"{JOB}@1#5").to_bytes())
    admin.put(P.necessary, b"test")
    t1 = time.time()
    runner.on_trigger(datetime.fromtimestamp(t1, UTC))
    wait_until(lambda: runner.pending_fires() == 1, 5)
    at = time.time()
    admin.put(P.trigger(rt.instance_id), json.dumps({"at": at, "params": PARAMS}).encode())
    wait_until(lambda: runner.pending_fires() == 2, 5, message="the run-now was not queued")
    for later in (0.01, 0.02):
        runner.on_trigger(datetime.fromtimestamp(t1 + later, UTC))
    assert runner.pending_fires() <= 3
    assert any(ft == pytest.approx(at, abs=1e-4) for ft in runner.pending_fire_times()), (
        "the run-now was folded away"
    )
    # release: the member and its item go, the reshard and the fires proceed
    admin.commit([Delete(P.running(5)), Delete(P.instance("other"))])
    runs = job.wait_for(
        lambda runs: sorted(r.item for r in runs if r.params == PARAMS) == [0, 1] and runs,
        15,
        message="the run-now never ran with its params",
    )
    with_params = [r for r in runs if r.params == PARAMS]
    assert all(r.fire_time == pytest.approx(at, abs=1e-4) for r in with_params), with_params


def test_a_run_now_that_finds_its_items_running_runs_after_them_with_its_params(
    memory_server: MemoryServer, runtimes: list[Runtime]
) -> None:
    """The same loss by the other road: a run-now with params that found the items
    still running here became the plain misfire re-run (no params). It runs once
    they end, as asked."""
    admin = memory_server.store()
    admin.start()
    job = Holding(hold=lambda ctx: not ctx.params)
    rt = Runtime(memory_server.store(), shutdown_grace=1, worker_threads=4)
    rt.add_job(job, JobConfig(name=JOB, cron="0 0 1 1 *", sharding_total_count=2))
    runtimes.append(rt)
    rt.start()
    runner = rt.runners[JOB]
    wait_until(lambda: runner.state.registered, 10)
    runner.on_trigger(datetime.now(UTC))
    wait_until(lambda: len([r for r in job.runs if r.held]) == 2, 10)
    at = time.time()
    admin.put(P.trigger(rt.instance_id), json.dumps({"at": at, "params": PARAMS}).encode())
    wait_until(lambda: runner.stats["misfires"] >= 1, 10, message="the run-now was not deferred")
    job.release.set()
    wait_until(
        lambda: sorted(r.item for r in job.runs if r.params == PARAMS) == [0, 1],
        10,
        message=lambda: f"the run-now never ran with its params: {job.runs}",
    )
    assert all(r.fire_time == pytest.approx(at, abs=1e-4) for r in job.runs if r.params)


def test_a_run_now_made_before_a_missed_fire_runs_before_that_fires_re_run(
    memory_server: MemoryServer, runtimes: list[Runtime]
) -> None:
    """The items run; a run-now with params is deferred behind them, then a fire of
    the schedule is missed. Once they end, the run-now (the earlier) runs first and
    the plain re-run after it. Before, the re-run always went first: while fires kept
    coming faster than the item ran, every batch's end queued a new re-run ahead of
    the run-now, which waited behind them all (600 s chaos on etcd: its params reached
    the item 10.6 s late, after ten later fires)."""
    admin = memory_server.store()
    admin.start()
    job = Holding(hold=lambda ctx: not ctx.params and not ctx.is_misfire)
    rt = Runtime(memory_server.store(), shutdown_grace=1, worker_threads=4)
    rt.add_job(job, JobConfig(name=JOB, cron="0 0 1 1 *", sharding_total_count=2, misfire=True))
    runtimes.append(rt)
    rt.start()
    runner = rt.runners[JOB]
    wait_until(lambda: runner.state.registered, 10)
    runner.on_trigger(datetime.now(UTC))
    wait_until(lambda: len([r for r in job.runs if r.held]) == 2, 10)
    at = time.time()
    admin.put(P.trigger(rt.instance_id), json.dumps({"at": at, "params": PARAMS}).encode())
    wait_until(lambda: runner.stats["misfires"] >= 1, 10, message="the run-now was not deferred")
    later = time.time()
    runner.on_trigger(datetime.fromtimestamp(later, UTC))
    wait_until(lambda: runner.stats["misfires"] >= 2, 10, message="the fire was not deferred")
    job.release.set()

    def both_ran() -> bool:
        runs = job.runs
        return (
            len([r for r in runs if r.params]) == 2
            and len([r for r in runs if r.misfire and not r.params]) == 2
        )

    wait_until(both_ran, 15, message=lambda: f"the run-now and the re-run did not run: {job.runs}")
    runs = job.runs
    after = [r for r in runs if not r.held]
    first_request = min(n for n, r in enumerate(after) if r.params)
    first_rerun = min(n for n, r in enumerate(after) if r.misfire and not r.params)
    assert first_request < first_rerun, after
    assert all(r.fire_time == pytest.approx(at, abs=1e-4) for r in after if r.params)
