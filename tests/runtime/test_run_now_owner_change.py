"""A run-now part whose fire gave up waiting (for a dead owner's marks, for the
reshard its death brings) is decided again at once at its own fire time, by the
owner it had then, instead of waiting for the next look at the requests.

600 s etcd chaos (job ``long``, request at T+133.4, items 1 and 5): the items'
part became vm@8282's by a reshard while their old owner ran a plain fire of
them; that owner was killed, vm@8282's request fire waited for its marks, then
for the reshard the death brought, and gave up 1.2 s before the reshard came.
The next look queued the part at the time of that look, from the owners of that
time: the items had moved to another member, then moved again, and the part ran
35 s after the request (the judge's bound: 25 s).
"""

from __future__ import annotations

import logging
import time

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.model import Assignment, RunningMark
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.ops import Operations
from shardkeeper.registry.memory import MemoryServer
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until
from shardkeeper.testing.jobs import RecordingJob

pytestmark = pytest.mark.timeout(60)

JOB = "rnowner"
P = JobPaths(JOB)
PARAMS = {"op": "2-488283"}
NEVER = "0 0 1 1 *"
#: a member that holds a mark and owns an item from a later fire, and runs nothing
SLOW = "slow@1@member"


def test_a_part_whose_fire_gave_up_waiting_runs_at_its_own_time_once_the_item_is_free(
    memory_server: MemoryServer,
    runtimes: list[Runtime],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Item 1 is ours at the request's fire, but marked running by another member
    (an earlier fire: a dead owner's run taken over by failover, say) for longer
    than the fire may wait. Meanwhile a reshard gives item 1 to that member from a
    later fire on. The request's fire gives up on item 1; once the mark is gone,
    item 1's part runs here, with the params. Before, the part waited for a look
    at the requests, which found item 1 the other member's (the owners of that
    look's time) and never queued it here: it ran only if and when that member
    did."""
    caplog.set_level(logging.INFO, logger="shardkeeper.runtime.runner.runner")
    admin = memory_server.store()
    admin.start()
    job = RecordingJob()
    rt = Runtime(memory_server.store(), shutdown_grace=1, worker_threads=4)
    cfg = JobConfig(
        name=JOB,
        cron=NEVER,
        sharding_total_count=2,
        sharding_wait_timeout=3.0,
        misfire=True,
        reconcile_interval=0,
    )
    rt.add_job(job, cfg)
    runtimes.append(rt)
    rt.start()
    runner = rt.runners[JOB]
    me = rt.instance_id
    wait_until(lambda: runner.state.registered and runner.leader.is_leader, 10)
    ops = Operations(admin)
    ops.trigger(JOB)  # the assignment: both items are ours
    wait_until(lambda: len(job.runs) == 2 and runner.idle, 10)
    admin.put(P.instance(SLOW), b"{}", ephemeral=True)
    admin.put(P.running(1), RunningMark(SLOW, time.time() - 1, f"{JOB}@{SLOW}#1").to_bytes())

    ops.trigger(JOB, params=PARAMS)
    wait_until(
        lambda: [r.item for r in job.runs if r.params == PARAMS] == [0],
        10,
        message=lambda: f"item 0 did not run with the params: {job.runs}",
    )
    # the request's fire waits for item 1: a reshard gives the item to the other
    # member from now on (the fires up to now keep their owners)
    node = admin.get(P.sharding)
    assert node is not None
    before = Assignment.from_bytes(node.value)
    moved = Assignment(
        total=2,
        owners={0: me, 1: SLOW},
        generation=before.generation + 1,
        leader=me,
        at=time.time(),
        effective_fire=time.time(),
        previous={0: me, 1: me},
        previous_effective=0.0,
        births=before.births,
    )
    admin.put(P.sharding, moved.to_bytes())

    def gave_up() -> bool:
        return any(
            "not started here now (items still run elsewhere" in r.getMessage()
            for r in caplog.records
        )

    wait_until(gave_up, 15, message="the request's fire did not give up on item 1")
    admin.delete(P.running(1))
    wait_until(
        lambda: sorted(r.item for r in job.runs if r.params == PARAMS) == [0, 1],
        10,
        message=lambda: f"item 1's part did not run here once it was free: {job.runs}",
    )
    ran = [r for r in job.runs if r.params == PARAMS and r.item == 1]
    assert [r.instance for r in ran] == [me]
    wait_until(lambda: not admin.children(P.runnow_root), 10, message="the request stayed")


def test_a_part_refused_as_before_the_rejoin_is_decided_again_at_once(
    memory_server: MemoryServer, runtimes: list[Runtime], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request's fire queued here before this instance joined the job again (a new
    session) is refused as "fired before this instance (re-)joined"; it is decided
    again at once, at the time of the new membership, and its parts run with their
    params. Before, it stayed for the next look at the requests, a housekeeping pass
    later (600 s etcd chaos, seed 20261254: the part ran past its bound). The looks
    are held off here, so only the re-decision can run the parts."""
    from shardkeeper.counters import SkipReason
    from shardkeeper.runtime.fire.trigger import Fire, Skipped

    admin = memory_server.store()
    admin.start()
    job = RecordingJob()
    rt = Runtime(memory_server.store(), shutdown_grace=1, worker_threads=4)
    rt.add_job(job, JobConfig(name=JOB, cron=NEVER, sharding_total_count=2, misfire=True))
    runtimes.append(rt)
    rt.start()
    runner = rt.runners[JOB]
    wait_until(lambda: runner.state.registered and runner.leader.is_leader, 10)
    ops = Operations(admin)
    ops.trigger(JOB)  # the assignment: both items are ours
    wait_until(lambda: len(job.runs) == 2 and runner.idle, 10)
    monkeypatch.setattr(runner.runnow, "check", lambda: [])
    ops.trigger(JOB, params=PARAMS)
    [request] = admin.children(P.runnow_root)
    joined = runner.state.joined_at
    fire = Fire(joined - 5.0, manual=True, params=dict(PARAMS), only=frozenset({0, 1}))
    fire.request = request
    runner.fires.record(fire, Skipped(SkipReason.BEFORE_JOIN))
    wait_until(
        lambda: sorted(r.item for r in job.runs if r.params == PARAMS) == [0, 1],
        10,
        message=lambda: f"the parts did not run: {job.runs}",
    )
    assert all(r.fire_time >= joined - 1e-3 for r in job.runs if r.params == PARAMS)
