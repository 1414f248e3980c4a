"""A registration beside the lane's failover claim never moves the claim's fresh mark.

Reliability review of 3005b15, finding 5: at start-up ``register()`` runs on the
thread that called ``Runtime.start()``, off the job's lane. Its hand-off of stray
marks (``requeue_own``) read the mark of a failover claim the lane had just
committed but not yet launched: neither owned by a batch nor of a fire being
decided, it was moved back to the queue while the lane went on to run it, and the
re-queued entry was claimed and run again (two valid runs at once). Replayed on the
MemoryStore with a pause that holds the claim between its commit and its return.
"""

from __future__ import annotations

import time

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.model import FailoverEntry
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.registry.memory import MemoryServer
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until
from shardkeeper.testing.jobs import RecordingJob

pytestmark = pytest.mark.timeout(60)

JOB = "claimrace"
P = JobPaths(JOB)


def test_a_registration_beside_a_claim_in_flight_leaves_its_mark(
    memory_server: MemoryServer, runtimes: list[Runtime]
) -> None:
    admin = memory_server.store()
    admin.start()
    job = RecordingJob()
    rt = Runtime(memory_server.store(), shutdown_grace=1)
    # one item, fired once an hour: only the claim below runs anything
    rt.add_job(job, JobConfig(name=JOB, interval=3600, sharding_total_count=1, failover=True))
    rt.start()
    runtimes.append(rt)
    runner = rt.runners[JOB]
    wait_until(lambda: runner.state.registered and runner.leader.is_leader, 10)
    # the lane's claim of item 5 (an orphan of a dead instance): applied, not returned
    held = memory_server.pause("commit", when="after", path=P.running(5), thread="sk-coord")
    entry = FailoverEntry(time.time() - 2, f"{JOB}@1#5", "ghost@1@dead")
    admin.create(P.failover_item(5), entry.to_bytes())
    try:
        assert held.wait_reached(10), "the lane never claimed the orphan"
        assert admin.exists(P.running(5)) and not admin.exists(P.failover_item(5))
        runner.register()  # what the registrar thread runs at a restart
    finally:
        held.release()
    # settled: the claim ran and completed (with a second claim, only once that ran)
    wait_until(
        lambda: (
            any(r.item == 5 for r in job.runs)
            and not admin.exists(P.running(5))
            and not admin.exists(P.failover_item(5))
        ),
        15,
        message="the claim never ran to completion",
    )
    assert [r.item for r in job.runs].count(5) == 1, "item 5 ran twice"
    assert runner.stats["failovers"] == 1, runner.stats
