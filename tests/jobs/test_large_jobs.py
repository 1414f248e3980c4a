"""Jobs whose items exceed one commit's operation limit, and misfire off."""

from __future__ import annotations

import threading
from collections import Counter

from shardkeeper.config import JobConfig
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.registry.base import CoordinationStore
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until

COUNT = 300  # > 2 x 128: the running marks span three commits


class _Recorder(ShardedJob):
    def __init__(self) -> None:
        self.runs: Counter[float] = Counter()
        self.tokens: dict[int, int] = {}
        self.lock = threading.Lock()

    def execute(self, ctx: ShardingContext) -> None:
        with self.lock:
            self.runs[ctx.fire_time.timestamp()] += 1
            self.tokens[ctx.item] = ctx.fencing_token


def test_items_beyond_one_commit_all_run_and_leave_no_marks(
    registry_url: str, store: CoordinationStore
) -> None:
    """300 items on one instance: every trigger runs all of them (marks written in
    chunks, each chunk with its own fencing token), and completion clears every mark."""
    job = _Recorder()
    rt = Runtime(registry_url, shutdown_grace=5)
    rt.add_job(job, JobConfig(name="big", interval=1, sharding_total_count=COUNT))
    with rt:
        wait_until(
            lambda: sum(1 for n in job.runs.values() if n == COUNT) >= 2,
            30,
            message=lambda: f"runs per fire: {dict(job.runs)}",
        )
        assert len(set(job.tokens.values())) >= 3  # one token per chunk
        assert all(n == COUNT for n in list(job.runs.values())[1:-1])
    assert store.children(JobPaths("big").running_root) == []


def test_job_with_misfire_off_runs(registry_url: str) -> None:
    """misfire=False is a valid configuration that schedules and runs."""
    job = _Recorder()
    rt = Runtime(registry_url, shutdown_grace=2)
    rt.add_job(job, JobConfig(name="nomis", interval=1, sharding_total_count=2, misfire=False))
    with rt:
        wait_until(lambda: sum(job.runs.values()) >= 4, 20, message="job never ran")
