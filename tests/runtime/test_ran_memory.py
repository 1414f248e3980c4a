"""The "already ran here" memory covers a whole batch (review finding 12).

A start commit applied late (after its retried twin ran and cleared its items) marks
them again; the repair pass clears marks of executions that ran here instead of
handing them to failover. The memory held 4,096 ids per job, oldest first out, while
a batch may hold up to 100,000 items: a batch of 5,000 forgot its own first 904 at
once, and their late marks were failed over and run a second time.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.model import RunningMark
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.registry.base import Op, Put
from shardkeeper.registry.memory import MemoryServer
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until
from shardkeeper.testing.jobs import RecordingJob

pytestmark = pytest.mark.timeout(120)

JOB = "big"
P = JobPaths(JOB)
ITEMS = 5_000


@pytest.fixture
def server() -> Iterator[MemoryServer]:
    srv = MemoryServer(groups_apart=True)
    try:
        yield srv
    finally:
        srv.shutdown()


def test_late_marks_of_a_batch_larger_than_the_id_memory_are_cleared_not_failed_over(
    server: MemoryServer, runtimes: list[Runtime]
) -> None:
    """A batch of 5,000 items ran here; then its marks reappear (the late apply).
    A suspect repair pass clears every one of them: none is queued for failover,
    and no item runs twice."""
    admin = server.store()
    admin.start()
    job = RecordingJob()
    rt = Runtime(server.store(), shutdown_grace=1, worker_threads=8)
    config = JobConfig(
        name=JOB, cron="0 0 1 1 *", sharding_total_count=ITEMS, failover=True, misfire=False
    )
    rt.add_job(job, config)
    runtimes.append(rt)
    rt.start()
    runner = rt.runners[JOB]
    wait_until(lambda: runner.state.registered, 10)
    runner.on_trigger(datetime.now(UTC))
    wait_until(lambda: len(job.runs) == ITEMS and runner.idle, 60)
    assert not admin.children(P.running_root)
    ops: list[Op] = []
    for run in job.runs:
        late = RunningMark(rt.instance_id, run.fire_time, run.execution_id)
        ops += [Put(P.running(run.item), late.to_bytes()), Put(f"{P.running(run.item)}/fence-late")]
    for start in range(0, len(ops), 100):
        admin.commit(ops[start : start + 100])
    runner.state.marks_suspect = True
    runner.request_repair()
    wait_until(
        lambda: not admin.children(P.running_root) or admin.children(P.failover_queue),
        60,
        message="the late marks were neither cleared nor queued",
    )
    wait_until(lambda: runner.idle, 30)
    assert not admin.children(P.failover_queue), "late marks of a batch run here went to failover"
    assert len(job.runs) == ITEMS, f"{len(job.runs) - ITEMS} executions ran a second time"
