"""Skipped triggers are logged as state changes and summaries (issue 15 item 12)."""

from __future__ import annotations

import logging
import time

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.registry.memory import MemoryServer
from shardkeeper.runtime import Runtime
from shardkeeper.runtime.fire.skiplog import SkipLog
from shardkeeper.runtime.job.jobstate import SkipReason
from shardkeeper.testing.faults import wait_until

pytestmark = pytest.mark.timeout(60)


class Noop(ShardedJob):
    def execute(self, ctx: ShardingContext) -> None:
        pass


def test_many_skips_give_one_line_then_a_summary(caplog: pytest.LogCaptureFixture) -> None:
    """500 jobs skipping for one reason: one line naming the first, then one summary
    per window with the counts."""
    now = [0.0]
    skips = SkipLog(window=30, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger="shardkeeper")
    for n in range(500):
        skips.record(f"job-{n}", SkipReason.SUSPENDED, 1.0, "")
    assert len(caplog.records) == 1 and "job-0" in caplog.records[0].getMessage()
    now[0] = 31.0
    skips.flush()
    assert len(caplog.records) == 2
    assert "500 triggers of 500 jobs" in caplog.records[1].getMessage()
    # a window without that reason: the next one is news again
    now[0] = 62.0
    skips.flush()
    skips.record("job-7", SkipReason.SUSPENDED, 2.0, "")
    assert len(caplog.records) == 3 and "job-7" in caplog.records[2].getMessage()


def test_a_store_outage_logs_a_few_lines_not_one_per_job_and_fire(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """While the store is away, 50 jobs firing every 0.2 s used to log one WARNING per
    job per fire (about 250 lines a second)."""
    server = MemoryServer()
    store = server.store(session_timeout=4.0)
    rt = Runtime(store, shutdown_grace=0)
    for n in range(50):
        rt.add_job(Noop(), JobConfig(name=f"job-{n}", interval=0.2, sharding_total_count=1))
    rt.start()
    try:
        wait_until(lambda: all(r.stats["executed"] for r in rt.runners.values()), 15)
        caplog.clear()
        caplog.set_level(logging.WARNING, logger="shardkeeper")
        store.suspend()
        t0 = time.monotonic()
        wait_until(lambda: sum(r.stats["skipped"] for r in rt.runners.values()) >= 500, 20)
        skipped = sum(r.stats["skipped"] for r in rt.runners.values())
        lines = [r for r in caplog.records if "skipped" in r.getMessage()]
        assert len(lines) <= 3, [r.getMessage() for r in lines]
        print(f"\n{skipped} skipped triggers in {time.monotonic() - t0:.1f}s: {len(lines)} lines")
        store.resume()
    finally:
        rt.stop_now()
        server.shutdown()
