"""An instance whose stop has begun claims no failover entry.

600 s chaos on ZooKeeper (seed 20261241): vm@22649 got SIGTERM (graceful stop, 10 s
grace) and 0.47 s later took over 161 queued bulk items; they ran, but their
completion commits had not finished when the grace ended and the store closed, so
they failed over and ran a third time elsewhere (103 duplicates). The claim checked
the stop only before it began, and a claim round on a loaded store takes seconds.

Replayed on the MemoryStore with a pause that holds the lane's claim: the stop
begins while the claim is being decided (its queue read) or while its commit is on
its way. Either way the stopping instance runs nothing and the entry stays queued,
as it was, for the others.
"""

from __future__ import annotations

import threading
import time

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.failover import FailoverService
from shardkeeper.coordination.model import FailoverEntry
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.registry.memory import MemoryServer, MemoryStore
from shardkeeper.runtime import Runtime
from shardkeeper.runtime.runner.runner import JobRunner
from shardkeeper.testing.faults import wait_until
from shardkeeper.testing.jobs import RecordingJob

pytestmark = pytest.mark.timeout(60)

JOB = "stopclaim"
P = JobPaths(JOB)
ITEM = 5


def _start(
    memory_server: MemoryServer, runtimes: list[Runtime]
) -> tuple[MemoryStore, RecordingJob, JobRunner]:
    admin = memory_server.store()
    admin.start()
    job = RecordingJob()
    rt = Runtime(memory_server.store(), shutdown_grace=30)
    # one item, fired once an hour: only a failover claim runs anything
    rt.add_job(job, JobConfig(name=JOB, interval=3600, sharding_total_count=1, failover=True))
    rt.start()
    runtimes.append(rt)
    runner = rt.runners[JOB]
    wait_until(lambda: runner.state.registered and runner.leader.is_leader, 10)
    return admin, job, runner


def _lane_done(runner: JobRunner) -> None:
    """Wait until the job's lane has finished what it was doing (its tasks run one at
    a time, in order: a task queued now runs after the held claim)."""
    done = threading.Event()
    runner.submit("test-probe", done.set)
    assert done.wait(15), "the job's lane never got past the claim"


def _assert_not_claimed(
    admin: MemoryStore, job: RecordingJob, runner: JobRunner, entry: FailoverEntry
) -> None:
    assert [r.item for r in job.runs] == [], "the stopping instance ran the claimed item"
    assert not runner.batches.busy_items(), "the stopping instance holds a claimed batch"
    assert not admin.exists(P.running(ITEM)), "the item is marked running"
    queued = admin.get(P.failover_item(ITEM))
    assert queued is not None, "the entry left the queue"
    assert FailoverEntry.from_bytes(queued.value) == entry
    assert runner.stats.get("failovers", 0) == 0, runner.stats
    # and another instance takes it over
    claims = FailoverService(admin, P, "other@1@live").claim_many(limit=5)
    assert [c.item for c in claims] == [ITEM]


def test_a_stop_begun_while_the_claim_is_decided_claims_nothing(
    memory_server: MemoryServer, runtimes: list[Runtime]
) -> None:
    """The lane has read the queue (its claim is decided) when the stop begins: no
    claim commit is sent at all, the entry is left as it was."""
    admin, job, runner = _start(memory_server, runtimes)
    held = memory_server.pause("get_tree", when="after", path=P.failover_queue, thread="sk-coord")
    entry = FailoverEntry(time.time() - 2, f"{JOB}@1#{ITEM}", "ghost@1@dead")
    admin.create(P.failover_item(ITEM), entry.to_bytes())
    created = admin.get(P.failover_item(ITEM))
    assert created is not None
    try:
        assert held.wait_reached(10), "the lane never read the queue to claim"
        runner.begin_stop(notice_at=time.monotonic() + 30)  # SIGTERM: a graceful stop
    finally:
        held.release()
    _lane_done(runner)
    node = admin.get(P.failover_item(ITEM))
    assert node is not None and node.created_revision == created.created_revision, (
        "the entry was claimed (and handed back) rather than left alone"
    )
    _assert_not_claimed(admin, job, runner, entry)


@pytest.mark.parametrize("hard", [False, True], ids=["graceful", "hard"])
def test_a_stop_begun_while_the_claim_commits_hands_the_entry_back(
    memory_server: MemoryServer, runtimes: list[Runtime], hard: bool
) -> None:
    """The claim's commit is on its way when the stop begins (it is applied after):
    the claimed item is not launched but handed back to the queue at once, its entry
    as it was (the dead owner's fire, execution id and owner)."""
    admin, job, runner = _start(memory_server, runtimes)
    held = memory_server.pause("commit", path=P.running(ITEM), thread="sk-coord")
    entry = FailoverEntry(time.time() - 2, f"{JOB}@1#{ITEM}", "ghost@1@dead")
    admin.create(P.failover_item(ITEM), entry.to_bytes())
    try:
        assert held.wait_reached(10), "the lane never sent its claim commit"
        runner.begin_stop(hard=hard, notice_at=time.monotonic() + 30)
    finally:
        held.release()
    _lane_done(runner)
    _assert_not_claimed(admin, job, runner, entry)
